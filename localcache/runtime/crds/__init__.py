"""Kinds whose CRDs come and go (KServe's, or our own before they are installed).

- `crdwait`: wait until CRDs are served, answering probes meanwhile.
- `optional`: an informer that runs only while its kind's CRD is served.
- `crdcheck`: the controller that checks served CRD schemas keep the fields we write, and
  `schemadiff`: the pure diff it uses.
"""
