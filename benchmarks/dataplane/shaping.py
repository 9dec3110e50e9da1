"""Kernel traffic shaping (`tc`, htb + u32) of the data-plane benchmark's test bed.

The test bed (`localcache.devenv.testbed`) joins every node to the hub namespace's bridge
`lcbr0` through a veth pair: `veth<i>` on the hub side, `eth0` in node i's namespace. The
origin (the S3 store) runs in the hub namespace, so what it sends leaves the hub's own stack
through `lcbr0` and is then bridged to the node's `veth<i>`. Traffic between nodes is bridged
from one veth to another and never passes `lcbr0`'s own queue. Hence:

- origin, TOTAL egress capped at O: an htb root on `lcbr0`, class `ORIGIN_CLASS` at O (rate
  and ceil) chosen by a u32 filter on the IP source port of the origin; everything else the
  hub sends (the control plane) goes to `OTHER_CLASS`, unshaped in practice (10 Gbit/s);
- node download capped at B: an htb root on `veth<i>` whose only class runs at B (every byte
  towards node i, from the origin or from a peer);
- node upload capped at B: the same on node i's `eth0` (every byte node i sends).

Counters: `class_bytes(tc -s class show output, classid)` reads the bytes a class sent, the
origin's egress as the link saw it (IP and TCP headers included). The command builders are
pure (unit-tested); `apply` runs them through a runner such as `netns.Anchor.run`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

ORIGIN_CLASS = "1:10"
OTHER_CLASS = "1:99"
LINK_CLASS = "1:10"
UNSHAPED_BITS = 10_000_000_000  # what "not shaped" means here: 10 Gbit/s
QUANTUM = 60_000  # bytes; htb's default (rate / r2q) is far too big at 10 Gbit/s
MIN_BURST = 128 * 1024  # bytes: above a GSO segment (64 KiB), so a veth's packets pass

Command = list[str]
Runner = Callable[[Sequence[str]], object]


def burst(rate: int) -> int:
    """Bucket depth in bytes for `rate` bytes/s: 20 ms of it, at least `MIN_BURST`."""
    return max(MIN_BURST, rate // 50)


def _htb_class(dev: str, classid: str, rate_bits: int, depth: int) -> Command:
    return [
        "tc", "class", "add", "dev", dev, "parent", "1:", "classid", classid, "htb",
        "rate", f"{rate_bits}bit", "ceil", f"{rate_bits}bit",
        "burst", str(depth), "cburst", str(depth), "quantum", str(QUANTUM),
    ]  # fmt: skip


def origin_commands(dev: str, *, port: int, rate: int) -> list[Command]:
    """Cap what the hub sends from TCP/UDP source port `port` on `dev` at `rate` bytes/s in
    total; the rest of the hub's traffic on `dev` is left unshaped."""
    if not 0 < port < 65536 or rate <= 0:
        raise ValueError(f"bad origin cap: port {port}, rate {rate}")
    default = OTHER_CLASS.split(":")[1]
    return [
        ["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", default],
        _htb_class(dev, ORIGIN_CLASS, rate * 8, burst(rate)),
        _htb_class(dev, OTHER_CLASS, UNSHAPED_BITS, burst(UNSHAPED_BITS // 8)),
        [
            "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
            "u32", "match", "ip", "sport", str(port), "0xffff", "flowid", ORIGIN_CLASS,
        ],
    ]  # fmt: skip


def link_commands(dev: str, *, rate: int) -> list[Command]:
    """Cap everything `dev` sends at `rate` bytes/s."""
    if rate <= 0:
        raise ValueError(f"bad link rate: {rate}")
    default = LINK_CLASS.split(":")[1]
    return [
        ["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", default],
        _htb_class(dev, LINK_CLASS, rate * 8, burst(rate)),
    ]


def apply(run: Runner, commands: Sequence[Command]) -> None:
    """Run each command in order (the runner raises when one fails)."""
    for command in commands:
        run(command)


_CLASS = re.compile(r"^class htb (?P<id>\S+) ")
_SENT = re.compile(r"^\s*Sent (?P<bytes>\d+) bytes ")


def class_bytes(text: str, classid: str) -> int:
    """Bytes sent by htb class `classid`, from `tc -s class show dev D`; KeyError if absent."""
    current = None
    for line in text.splitlines():
        head = _CLASS.match(line)
        if head is not None:
            current = head["id"]
            continue
        sent = _SENT.match(line)
        if sent is not None and current == classid:
            return int(sent["bytes"])
    raise KeyError(f"no htb class {classid} in tc's output")
