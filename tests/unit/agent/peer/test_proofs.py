"""Cross-scope proofs end to end in one process: the peer server (plain HTTP on 127.0.0.1),
a requester of another scope, and a stand-in origin that answers HEADs as S3 does (its ETag,
its size; 403 for a signature it refuses). What the requester gets before, after and without
a proof. Signatures themselves are checked by a real store in the real-node tests."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from localcache.agent.peer import auth, proofs, server, throttle
from localcache.api import peer
from localcache.caching import keys
from localcache.runtime import clock, metrics

URI = "s3://models/bert"
KEY = keys.storage_key(URI)
OWNER, OTHER = "a" * 64, "b" * 64
FILES = {"config.json": b'{"arch": "bert"}', "tok/vocab.txt": b"hello\nworld\n" * 100}
NONCE_SIGNED = "host%3Bif-none-match"
REQUESTER = auth.Requester(namespace="t2", pod="dl", job="job", node="node-b", scope=OTHER)


class Authorizer:
    async def identify(self, token: str | None, storage_key: str) -> auth.Requester | auth.Refusal:
        if token == "owner":
            return dataclasses.replace(REQUESTER, scope=OWNER)
        return REQUESTER if token == "other" else auth.refusal("bad-token")


@dataclass
class Folders:
    served: server.ServedFolder
    partial: server.ServedFolder | None = None
    """The requester's own download in progress on this node (scope OTHER), if any."""

    def scopes(self, storage_key: str) -> frozenset[str]:
        partial = self.partial.scopes if self.partial is not None else frozenset()
        return self.served.scopes | partial if storage_key == KEY else frozenset()

    def lookup(self, storage_key: str, scope: str) -> server.ServedFolder | None:
        if storage_key == KEY and scope in self.served.scopes:
            return self.served
        if self.partial is not None and scope in self.partial.scopes:
            return self.partial
        return None

    def complete(self, storage_key: str) -> server.ServedFolder | None:
        return self.served if storage_key == KEY else None


@dataclass
class Origin:
    """HEAD /models/bert/<path>: 200 with the object's ETag and size, 403 for signature
    `deny`; every HEAD is recorded."""

    objects: dict[str, bytes] = field(default_factory=dict)
    heads: list[str] = field(default_factory=list)
    matches: list[str | None] = field(default_factory=list)
    """The `If-None-Match` of every HEAD (the proof's nonce)."""
    endpoint: str = ""
    checksums: dict[str, str] = field(default_factory=dict)
    """x-amz-checksum-sha256 of objects stored with one (answered in checksum mode)."""
    etags: dict[str, str] = field(default_factory=dict)
    """ETags that are not the MD5 (such as SSE-KMS's)."""

    async def head(self, request: web.Request) -> web.StreamResponse:
        self.heads.append(request.path)
        self.matches.append(request.headers.get("If-None-Match"))
        if request.query.get("X-Amz-Signature") == "deny":
            return web.Response(status=403)
        data = self.objects.get(request.path.removeprefix("/models/"))
        if data is None:
            return web.Response(status=404)
        key = request.path.removeprefix("/models/")
        headers = {"ETag": self.etags.get(key, f'"{hashlib.md5(data).hexdigest()}"')}
        if request.headers.get("x-amz-checksum-mode") == "ENABLED" and key in self.checksums:
            headers["x-amz-checksum-sha256"] = self.checksums[key]
        return web.Response(body=data, headers=headers)


@dataclass
class Bed:
    url: str
    folders: Folders
    origin: Origin
    clock: clock.FakeClock
    registry: metrics.Metrics
    session: aiohttp.ClientSession
    origin_sums: list[tuple[Path, str, dict[str, str]]]
    """What the prover passed on of the origin's SHA-256s (`on_origin_sums`)."""

    def presign(
        self, path: str, *, signature: str = "ab" * 32, at: float | None = None,
        signed: str = NONCE_SIGNED,
    ) -> str:  # fmt: skip
        date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if at is None else at))
        return (
            f"{self.origin.endpoint}/models/bert/{path}?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            f"&X-Amz-Credential=AKIA%2F20261206%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date={date}"
            f"&X-Amz-Expires=60&X-Amz-SignedHeaders={signed}&X-Amz-Signature={signature}"
        )

    def proof(self, **kw: object) -> dict[str, object]:
        heads = [{"path": p, "url": self.presign(p, **kw)} for p in FILES]  # type: ignore[arg-type]
        return {"uri": URI, "heads": heads}

    async def nonce(self, token: str = "other") -> str:
        headers = {"Authorization": f"Bearer {token}"}
        async with self.session.get(f"{self.url}{KEY}/proofs/nonce", headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return peer.ProofNonce.model_validate_json(await resp.read()).nonce

    async def prove(self, body: object, token: str = "other") -> tuple[int, dict[str, object]]:
        """POST `body`, with a nonce just issued to `token` unless it carries one."""
        if isinstance(body, dict) and "nonce" not in body:
            body = {**body, "nonce": await self.nonce(token)}
        async with self.session.post(
            f"{self.url}{KEY}/proofs", json=body, headers={"Authorization": f"Bearer {token}"}
        ) as resp:
            return resp.status, await resp.json(content_type=None)

    async def status(self, path: str, token: str = "other") -> int:
        headers = {"Authorization": f"Bearer {token}"}
        async with self.session.get(f"{self.url}{KEY}/{path}", headers=headers) as resp:
            await resp.read()
            return resp.status


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    folder = tmp_path / "models" / KEY
    entries = []
    for path, data in FILES.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
        entries.append(peer.ManifestFile(
            path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest()))  # fmt: skip
    digest = peer.manifest_digest(files=((f.path, f.size, f.sha256) for f in entries), dirs=["tok"])
    manifest = peer.PeerManifest(storage_key=KEY, digest=digest, files=entries, dirs=["tok"])
    origin = Origin(objects={f"bert/{p}": d for p, d in FILES.items()})
    app = web.Application()
    app.router.add_route("HEAD", "/models/{path:.+}", origin.head)
    origin_runner = web.AppRunner(app)
    await origin_runner.setup()
    site = web.TCPSite(origin_runner, "127.0.0.1", 0)
    await site.start()
    origin.endpoint = f"http://127.0.0.1:{origin_runner.addresses[0][1]}"
    fake, registry = clock.FakeClock(), metrics.Metrics()
    folders = Folders(server.ServedFolder(folder, manifest, frozenset({OWNER})))
    srv = server.PeerServer(
        folders=folders,
        authorizer=Authorizer(),
        slots=throttle.UploadSlots(lambda: 4),
        bucket=throttle.TokenBucket(lambda: None, clock=fake),
        metrics=registry.peer(),
        prover=proofs.Prover(
            clock=fake,
            origins=lambda: [origin.endpoint],
            wall=time.time,
            on_origin_sums=lambda *said: sums.append(said),
        ),
    )
    sums: list[tuple[Path, str, dict[str, str]]] = []
    port = await srv.start("127.0.0.1", 0, None)
    session = aiohttp.ClientSession()
    try:
        yield Bed(f"http://127.0.0.1:{port}{peer.WIRE_PREFIX}/models/", folders, origin, fake,
                  registry, session, sums)  # fmt: skip
    finally:
        await session.close()
        await srv.stop()
        await origin_runner.cleanup()


async def test_another_scope_is_served_only_after_proving_every_file_at_the_origin(
    bed: Bed,
) -> None:
    assert await bed.status("manifest") == 403
    assert await bed.status("files/config.json") == 403
    status, answer = await bed.prove(bed.proof())
    assert (status, answer["proven"]) == (200, True), answer
    assert sorted(bed.origin.heads) == sorted(f"/models/bert/{p}" for p in FILES)
    assert await bed.status("manifest") == 200
    assert await bed.status("files/tok/vocab.txt") == 200
    # the proof lasts PROOF_TTL_S, then the scope must prove again
    await bed.clock.advance(proofs.PROOF_TTL_S + 1)
    assert await bed.status("files/config.json") == 403


async def test_a_proven_scope_gets_the_proven_folder_not_its_own_download_in_progress(
    bed: Bed, tmp_path: Path
) -> None:
    """The requester's scope also downloads the model on this node (a peer-mode Job of its
    own, nothing whole yet): once proven, it is served the complete folder it proved (the
    real-node test found it served its own empty download, whose digest it refused)."""
    nothing = peer.manifest_digest(files=())
    bed.folders.partial = server.ServedFolder(
        tmp_path / "staging",
        peer.PeerManifest(storage_key=KEY, digest=nothing, complete=False, files=[]),
        frozenset({OTHER}),
    )
    assert await bed.status("manifest") == 503  # its own download: nothing yet
    status, answer = await bed.prove(bed.proof())
    assert (status, answer["proven"]) == (200, True), answer
    async with bed.session.get(
        f"{bed.url}{KEY}/manifest", headers={"Authorization": "Bearer other"}
    ) as resp:
        assert resp.status == 200
        served = peer.PeerManifest.model_validate_json(await resp.read())
    assert (served.complete, served.digest) == (True, answer["digest"])


async def test_the_owner_scope_needs_no_proof_and_no_origin_request(bed: Bed) -> None:
    status, answer = await bed.prove({"uri": URI, "heads": []}, token="owner")
    assert (status, answer["proven"]) == (200, True)
    assert bed.origin.heads == []


async def _refused(bed: Bed, body: object, status: int, reason: str) -> None:
    got, answer = await bed.prove(body)
    assert (got, answer.get("reason")) == (status, reason), answer
    assert await bed.status("manifest") == 403, "a refused proof must not open the folder"
    assert await bed.status("files/config.json") == 403
    assert bed.registry.value("localcache_p2p_refusals_total", reason=reason) == 1


async def test_a_signature_the_origin_refuses_opens_nothing(bed: Bed) -> None:
    await _refused(bed, bed.proof(signature="deny"), 403, "proof-denied")


async def test_an_expired_presign_is_refused_without_asking_the_origin(bed: Bed) -> None:
    await _refused(bed, bed.proof(at=time.time() - 120), 403, "proof-expired")
    assert bed.origin.heads == []


async def test_a_presign_of_another_object_is_refused(bed: Bed) -> None:
    body = bed.proof()
    heads = body["heads"]
    assert isinstance(heads, list)
    heads[0]["url"] = bed.presign("tok/vocab.txt")  # config.json "proved" with another object
    await _refused(bed, body, 403, "proof-object")


async def test_a_presign_at_an_origin_the_group_does_not_name_is_refused(bed: Bed) -> None:
    body = bed.proof()
    heads = body["heads"]
    assert isinstance(heads, list)
    heads[0]["url"] = heads[0]["url"].replace("127.0.0.1", "localhost")
    await _refused(bed, body, 403, "proof-origin")
    assert bed.origin.heads == []


async def test_a_proof_missing_a_file_is_a_different_listing(bed: Bed) -> None:
    body = bed.proof()
    heads = body["heads"]
    assert isinstance(heads, list)
    await _refused(bed, {"uri": URI, "heads": heads[:1]}, 409, "proof-files")


async def test_an_origin_object_that_differs_from_this_copy_is_a_mismatch(bed: Bed) -> None:
    bed.origin.objects["bert/config.json"] = b'{"arch": "bart"}'  # same size, other bytes
    await _refused(bed, bed.proof(), 409, "proof-mismatch")


async def test_another_models_uri_or_a_body_that_is_not_a_proof_is_refused(bed: Bed) -> None:
    await _refused(bed, {**bed.proof(), "uri": "s3://models/bert2"}, 403, "proof-scheme")
    got, answer = await bed.prove({"heads": "no"})
    assert (got, answer.get("reason")) == (400, "proof-malformed")


CHECKSUM_MODE = "host%3Bif-none-match%3Bx-amz-checksum-mode"


def _sha256_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


async def test_the_origins_own_sha256_proves_a_copy_whose_etag_is_no_md5(bed: Bed) -> None:
    """An object stored with a SHA-256 checksum (and an SSE-KMS-like ETag): compared with the
    manifest directly, asked for with the checksum mode the presign signed."""
    for path, data in FILES.items():
        bed.origin.etags[f"bert/{path}"] = '"kms-not-an-md5"'
        bed.origin.checksums[f"bert/{path}"] = _sha256_b64(data)
    status, answer = await bed.prove(bed.proof(signed=CHECKSUM_MODE))
    assert (status, answer["proven"]) == (200, True), answer
    assert await bed.status("files/config.json") == 200
    # the origin's own SHA-256s go on to be recorded in the folder's file list
    ((folder, digest, sums),) = bed.origin_sums
    assert (folder.name, digest) == (KEY, answer["digest"])
    assert sums == {p: hashlib.sha256(d).hexdigest() for p, d in FILES.items()}


async def test_only_the_checksums_the_origin_answered_are_passed_on(bed: Bed) -> None:
    """Files proven by their ETag have no SHA-256 of the origin's; a refused proof passes
    nothing on."""
    bed.origin.checksums["bert/config.json"] = _sha256_b64(FILES["config.json"])
    status, _ = await bed.prove(bed.proof(signed=CHECKSUM_MODE))
    assert status == 200
    assert [sums for _, _, sums in bed.origin_sums] == [
        {"config.json": hashlib.sha256(FILES["config.json"]).hexdigest()}
    ]
    bed.origin.checksums["bert/config.json"] = _sha256_b64(b"other bytes")
    status, answer = await bed.prove(bed.proof(signed=CHECKSUM_MODE))
    assert (status, answer["reason"]) == (409, "proof-mismatch")
    assert len(bed.origin_sums) == 1


async def test_checksums_the_file_list_already_holds_are_not_passed_on_again(bed: Bed) -> None:
    """Each proof would otherwise ask for a pass that re-reads the list."""
    bed.origin.checksums["bert/config.json"] = _sha256_b64(FILES["config.json"])
    served = bed.folders.served
    recorded = [
        f.model_copy(update={"origin_sha256": f.sha256}) if f.path == "config.json" else f
        for f in served.manifest.files
    ]
    manifest = served.manifest.model_copy(update={"files": recorded})
    bed.folders.served = dataclasses.replace(served, manifest=manifest)
    status, _ = await bed.prove(bed.proof(signed=CHECKSUM_MODE))
    assert status == 200
    assert bed.origin_sums == []


async def test_an_origin_checksum_other_than_the_manifests_is_a_mismatch(bed: Bed) -> None:
    """The ETag is the MD5 of this copy, but the origin's own SHA-256 says otherwise: the
    checksum wins."""
    bed.origin.checksums["bert/config.json"] = _sha256_b64(b"other bytes")
    await _refused(bed, bed.proof(signed=CHECKSUM_MODE), 409, "proof-mismatch")


async def test_an_etag_that_is_no_md5_and_no_checksum_proves_nothing(bed: Bed) -> None:
    bed.origin.etags["bert/config.json"] = '"kms-not-an-md5"'
    await _refused(bed, bed.proof(), 409, "proof-mismatch")


async def test_a_proof_lasts_while_it_is_used_and_ends_when_it_is_not(bed: Bed) -> None:
    status, _ = await bed.prove(bed.proof())
    assert status == 200
    for _ in range(3):  # a transfer longer than PROOF_TTL_S keeps it
        await bed.clock.advance(proofs.PROOF_TTL_S * 0.8)
        assert await bed.status("files/config.json") == 200
    await bed.clock.advance(proofs.PROOF_TTL_S + 1)
    assert await bed.status("files/config.json") == 403


async def test_a_folder_with_links_or_unimplied_directories_is_not_provable(bed: Bed) -> None:
    """The seed's pod wrote the folder: a link or a directory of its own is nothing the
    origin holds, so no proof can cover it."""
    served = bed.folders.served
    manifest = served.manifest
    for extra in (
        {"links": [peer.ManifestLink(path="evil", target="/etc")]},
        {"dirs": [*manifest.dirs, "extra"]},
    ):
        changed = manifest.model_copy(update=extra)
        changed = changed.model_copy(update={"digest": changed.computed_digest()})
        bed.folders.served = dataclasses.replace(served, manifest=changed)
        status, answer = await bed.prove(bed.proof())
        assert (status, answer.get("reason")) == (409, "proof-files"), extra
    assert bed.origin.heads == []


async def test_a_body_larger_than_the_folder_needs_is_refused_unread(bed: Bed) -> None:
    body = bed.proof()
    heads = body["heads"]
    assert isinstance(heads, list)
    padding = [{"path": f"pad/{i}", "url": "x" * 4000} for i in range(10)]
    got, answer = await bed.prove({**body, "heads": heads + padding})
    assert (got, answer.get("reason")) == (400, "proof-malformed")
    assert bed.origin.heads == []


async def test_the_heads_carry_the_nonce_and_a_nonce_proves_once(bed: Bed) -> None:
    nonce = await bed.nonce()
    body = {**bed.proof(signature="deny"), "nonce": nonce}
    assert (await bed.prove(body))[1].get("reason") == "proof-denied"
    assert set(bed.origin.matches) == {peer.nonce_header(nonce)}
    # replayed (a leaked proof, or the same one twice): the nonce is used up
    heads = len(bed.origin.heads)
    got, answer = await bed.prove({**bed.proof(), "nonce": nonce})
    assert (got, answer.get("reason")) == (403, "proof-nonce")
    assert len(bed.origin.heads) == heads, "a used nonce must not reach the origin"


async def test_a_nonce_issued_to_another_scope_or_none_at_all_is_refused(bed: Bed) -> None:
    owners = await bed.nonce(token="owner")
    got, answer = await bed.prove({**bed.proof(), "nonce": owners})
    assert (got, answer.get("reason")) == (403, "proof-nonce")
    got, answer = await bed.prove({**bed.proof(), "nonce": "lc-" + "0" * 32})
    assert (got, answer.get("reason")) == (403, "proof-nonce")
    assert bed.origin.heads == []


async def test_heads_that_do_not_sign_the_nonce_are_refused(bed: Bed) -> None:
    await _refused(bed, bed.proof(signed="host"), 403, "proof-malformed")
    assert bed.origin.heads == []


def _folder(storage_key: str) -> proofs.Folder:
    digest = peer.manifest_digest(files=())
    manifest = peer.PeerManifest(storage_key=storage_key, digest=digest, files=[])
    return proofs.Folder(Path("/nowhere"), manifest, OWNER)


async def test_one_scope_never_holds_all_the_proof_slots() -> None:
    prover = proofs.Prover(clock=clock.FakeClock(), origins=lambda: [], wall=time.time)
    release = asyncio.Event()
    entered: list[asyncio.Event] = []

    async def held(limit: int) -> peer.ProofRequest | None:
        entered[-1].set()
        await release.wait()
        return None

    async def unreadable(limit: int) -> peer.ProofRequest | None:
        return None

    running = []
    for held_key in (KEY, "f" * 16):  # two models of one scope at once
        entered.append(asyncio.Event())
        running.append(asyncio.create_task(prover.prove(_folder(held_key), OTHER, held)))
        done, _ = await asyncio.wait([running[-1], asyncio.ensure_future(entered[-1].wait())],
                                     timeout=10, return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        assert entered[-1].is_set(), f"the proof of {held_key} did not start: {done}"
    for key, why in ((KEY, "the same model again"), ("e" * 16, "a third model of the scope")):
        status, answer = await prover.prove(_folder(key), OTHER, unreadable)
        assert (status, answer.reason) == (429, "proof-busy"), why
    status, answer = await prover.prove(_folder("e" * 16), "c" * 64, unreadable)
    assert (status, answer.reason) == (400, "proof-malformed"), "another scope gets a slot"
    release.set()
    assert [(await task)[0] for task in running] == [400, 400]
    status, answer = await prover.prove(_folder("e" * 16), OTHER, unreadable)
    assert (status, answer.reason) == (400, "proof-malformed"), "the slots are free again"
    await prover.close()


def test_one_scope_asking_without_end_never_pushes_out_anothers_nonce() -> None:
    nonces = proofs.Nonces(clock.FakeClock())
    theirs = nonces.issue(OWNER, KEY)
    for i in range(proofs.MAX_NONCES + 1):
        nonces.issue(OTHER, f"{i:016x}")
    assert nonces.take(theirs, OWNER, KEY)


async def test_a_scope_keeps_its_newest_nonces_and_expired_ones_go_first() -> None:
    fake = clock.FakeClock()
    nonces = proofs.Nonces(fake)
    keys_ = [f"{i:016x}" for i in range(proofs.NONCES_PER_SCOPE + 1)]
    issued = [nonces.issue(OTHER, k) for k in keys_]
    assert not nonces.take(issued[0], OTHER, keys_[0]), "the scope's oldest was dropped"
    assert nonces.take(issued[1], OTHER, keys_[1])
    assert nonces.take(issued[-1], OTHER, keys_[-1])
    await fake.advance(proofs.NONCE_TTL_S)
    late = nonces.issue(OWNER, KEY)
    assert not nonces.take(issued[2], OTHER, keys_[2]), "expired"
    assert nonces.take(late, OWNER, KEY)


def test_a_full_model_and_a_full_scope_drop_one_nonce_not_two() -> None:
    nonces = proofs.Nonces(clock.FakeClock())
    first = nonces.issue(OTHER, "0" * 16)
    for _ in range(proofs.NONCES_PER_REQUESTER):
        nonces.issue(OTHER, KEY)
    others = proofs.NONCES_PER_SCOPE - proofs.NONCES_PER_REQUESTER - 1
    for i in range(others):
        nonces.issue(OTHER, f"{i + 1:016x}")
    nonces.issue(OTHER, KEY)  # the model's oldest goes: the scope is then within its bound
    assert nonces.take(first, OTHER, "0" * 16)
