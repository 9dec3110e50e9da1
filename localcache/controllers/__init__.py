"""The cluster-cache and namespace-cache reconcilers of the controller process."""
