"""The programs that run inside download Jobs: `localcache download <uri> <dest>` and, for a
peer-mode Job, `localcache fetch ... <dest>`.

- `program`: the command (arguments, limits, exit codes) and the atomic download of a
  `file://` or `http(s)://` URI into a directory;
- `http`: streaming one URL to a file with timeouts, retries, redirect checks and limits;
- `staging`: the hidden staging directory under the destination and the atomic commit;
- `peercommand`, `peerfetch`, `peersources`, `peerlayout`: `localcache fetch`, a model folder
  from peer nodes' agents over TLS (the command and its report, the transfer engine, the
  sources and credentials, the manifest's tree); `peerproof`: the proof of access at an S3
  origin a download pod of another credential scope gives its sources first (botocore);
- `importcommand`, `importplace`, `importwalk`, `importlayout`: `localcache import
  prepare|progress|place`, the program of a shared-volume cache's import pod (staging on the
  claim, atomic placement with recovery, a bounded progress walk, the layout's names).

A download Job's or an import Job's pod runs only this, so the package imports nothing of
the operator: no agent, controllers, webhooks or development environment; from localcache
only itself, `runtime.durable` (fsync and atomic writes, shared with the agent),
`runtime.fstree`, `runtime.clock`, `runtime.errors`, `api.quantity` and the peer wire models
`api.peer` (on `api.meta`) (`tests/unit/foundation/test_architecture.py`, rule `download`).
"""
