"""The agent's models roots on the node: the folders a download lands in and is served from.

- `layout`: names and records of the model-folder protocol (pure);
- `folders`: `ModelDisk`, one root's folders: layout, staging, promotion, crash recovery,
  adoption of KServe's folders;
- `trash`: deleting what no entry references, through `.trash`, with retries;
- `tree`: walking a downloaded tree without trusting it (size, modes, removal);
- `roots`: several roots, which one serves a node group, and the keep rule;
- `rootdir`: preparing a fresh node's root (`localcache prepare-models-root`).

Durable writes (fsync, atomic JSON) are `localcache.runtime.durable`, shared with the
download program.
"""
