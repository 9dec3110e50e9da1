"""The framework's own metric series as plain numbers, and the recorders that move them:
controller-runtime's controller, work queue and leader-election series (`controllers`),
client-go's REST client series (`restclient`), on the storage of `families`. No
prometheus_client here: `runtime.metrics` exposes them.
"""
