"""The agent's peer server (issue 23): serves complete, hashed model folders of this node to
peer-mode download pods of trusted Jobs, over TLS, within the node group's caps.

`server` (aiohttp app, `PeerServer`, the `FolderSource` protocol the agent implements),
`auth` (TokenReview + pod + Job record -> `Requester` or `Refusal`), `throttle` (upload slots,
shared byte rate), `files` (ranges, safe opens beneath a folder), `tls` (the certificate),
`proofs` and `presigned` (another credential scope served after proving access at the S3
origin: the presigned HEADs this node checks and runs, the ETag against its own bytes).
"""
