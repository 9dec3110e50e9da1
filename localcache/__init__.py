"""localcache: a Kubernetes operator that keeps ML models on node-local disks for KServe."""
