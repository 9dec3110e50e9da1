"""Typed models of the serving.kserve.io/v1alpha1 LocalModel kinds and the ISVC subset we use.

- `groupversion`: group, version and names of every kind (the one source for watches and CRDs).
- `meta`: the model base (`ApiModel`: camelCase JSON, unknown fields kept), ObjectMeta,
  Condition; `quantity`: exact Kubernetes quantities.
- `modelcache` (LocalModelCache, LocalModelNamespaceCache), `modelnode` (LocalModelNode),
  `nodegroup` (LocalModelNodeGroup), `storage` (storage spec, ClusterStorageContainer),
  `inferenceservice` (the ISVC subset and the label/annotation names).
- `schema` and `crdgen`: the CRDs generated from these models (`make manifests`).
- `coreschema`: core/v1 schemas (PV and PVC specs) extracted from Kubernetes' OpenAPI into the
  checked-in `corev1-schemas.json`, for the CRD fields that embed them.

Objects travel as plain dicts elsewhere; domain code parses them here with
`Model.from_dict(obj)` and writes them back with `model.to_dict()`.
"""
