"""The development environment: a clone's, never the image's or the wheel's.

What `localcache run` uses from a clone and what the tests build on, as controller-runtime's
`pkg/envtest` is for its users: the local control plane built from source (`controlplane`,
`certs`, `processes`, `crds`, `waiting`), the demo Job runner that plays the nodes on a bare
control plane (`jobrunner`, `jobpods`), the HTTP model server (`modelserver`), the real-node
test bed (`testbed`, `node`, `netns`, `cgroups`, `nsforward`) and the local run itself
(`local`, `localmode`, `realnodes`).

Only `localcache.cli` imports this package, lazily, inside the `run` command; nothing here
imports pytest or the test suite (`tests.support` holds the pytest-only pieces).
"""
