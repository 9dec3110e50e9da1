"""Migration from KServe's own local model cache add-on to localcache, on real nodes."""
