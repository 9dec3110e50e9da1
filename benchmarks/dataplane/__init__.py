"""The data-plane benchmark (`make bench-dataplane`, `python -m benchmarks.dataplane`).

What it measures (issue 23, "How it is measured"): how long N real nodes take to hold one
model, and how many bytes leave the origin, when every node downloads from the origin
(the baseline: today's behaviour and KServe's, with KServe's storage initializer) and when
the node group has `spec.peerDistribution.enabled: true` (the peer mode), run in alternating
pairs on the same bed so that every figure stands beside a baseline measured in the same run.

Set-up (`bed`): its own real-node test bed of max(N) nodes, an `s3://` model of 8 files
(256 MB by default) in a credential-enforcing S3 store (moto) in the hub namespace, the
origin's TOTAL egress capped by kernel `tc` at O (default 8 MiB/s) and each node's link at
B = 5·O both ways (`shaping`). Figures (`figures`): origin bytes ÷ size, time to the last node
÷ T1 (the N = 1 baseline), the overhead at N = 1, CPU seconds of agents and download pods
(`cpu`). Not part of `make bench` nor `make test`: it needs root, namespaces and minutes.
"""
