"""The agent's download Jobs: what one looks like, creating and deleting them, and which
ones the agent trusts. Why a download failed, as it may be published, is
`caching.jobfailures`; the download container's template is `caching.downloadcontainer`
(the controller's import Jobs use both).

- `jobs`: the download Job's spec, a pure function of entry, node, node group, config and
  credentials (names, labels, pod shape);
- `launcher`: `JobLauncher`, the only part of the agent that creates or deletes Jobs (and
  reads the credentials and the failed pods' messages they need);
- `trust`: the records of the Jobs the agent created, by uid: the only Jobs it trusts.
"""
