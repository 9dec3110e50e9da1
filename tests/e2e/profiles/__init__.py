"""The install profiles (standalone, with-kserve; kustomize and Helm) on real nodes, beside
KServe v0.20.0's own CRDs, ConfigMap and documented sample (issue 12, "What it must show")."""
