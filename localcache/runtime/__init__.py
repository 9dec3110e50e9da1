"""The framework: informers, work queue, controllers, leader election, metrics, admission.

Hand-rolled on raw kubernetes-asyncio watches with client-go semantics. Knows nothing of
LocalModel types: objects are plain dicts (`runtime.kube.Obj`) keyed by `runtime.keys.ObjectKey`.
"""
