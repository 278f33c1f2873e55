"""sync: make a destination store hold exactly what a source manifest lists, moving only what differs.

Order of work (each step safe to interrupt; the same command resumes):
1. source manifest: a local directory is scanned (cached hashes); a remote source must hold a manifest;
2. leftovers of interrupted writes at the destination are removed (partial files, multipart uploads);
3. plan: an entry is sent unless the destination holds an object of the same size whose recorded
   sha256 matches. The ETag recorded in the destination's manifest settles it without a HEAD: equal
   means the very object we wrote, different means it was replaced behind our back (re-sent);
4. if anything will change, the destination's old manifest is removed first, then objects move,
   ``delete`` removes what the manifest says is gone, and the new manifest is written LAST.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from clustertrain.core.errors import StorageError
from clustertrain.storage.manifest import Manifest, ManifestEntry, hash_file, parse_manifest, scan_directory
from clustertrain.storage.progress import make_progress
from clustertrain.storage.store import (
    MANIFEST_NAME,
    IncompleteCleanup,
    LocalPaths,
    MissingObjectError,
    ObjectInfo,
    ObjectStore,
    StoreConfig,
    check_key,
)
from clustertrain.storage.stores import open_store


@dataclass
class SyncPlan:
    """What a sync will do; ``--dry-run`` prints it."""

    src: str
    dst: str
    send: list[ManifestEntry] = field(default_factory=list)
    unchanged: list[ManifestEntry] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # destination objects not ours to delete

    @property
    def send_bytes(self) -> int:
        return sum(e.size for e in self.send)


@dataclass
class SyncResult:
    """What a sync did."""

    plan: SyncPlan
    dry_run: bool = False
    transferred_files: int = 0
    transferred_bytes: int = 0
    deleted: int = 0
    cleaned_incomplete: int = 0
    hashed_files: int = 0
    manifest_written: bool = False
    seconds: float = 0.0


def read_manifest(store: ObjectStore) -> Manifest | None:
    """The manifest at a store's root, or None when there is none (a store never synced, or incomplete)."""
    if isinstance(store, LocalPaths):
        path = store.root / MANIFEST_NAME
        return parse_manifest(path.read_bytes(), str(path)) if path.is_file() else None
    with tempfile.TemporaryDirectory(prefix="ct-manifest-") as tmp:
        target = Path(tmp) / "m.json"
        try:
            store.get(MANIFEST_NAME, target)
        except MissingObjectError:
            return None
        return parse_manifest(target.read_bytes(), f"{store.url}/{MANIFEST_NAME}")


def _as_store(where: str | Path | ObjectStore, options: StoreConfig | None, progress: bool) -> ObjectStore:
    return where if isinstance(where, ObjectStore) else open_store(where, options, progress=progress)


def source_manifest(src: ObjectStore, *, progress: bool = False) -> tuple[Manifest, int]:
    """The manifest describing ``src`` and how many files had to be hashed for it."""
    if isinstance(src, LocalPaths):
        if not src.root.is_dir():
            raise StorageError(f"source directory {src.root} does not exist; check the path")
        return scan_directory(src.root, progress=progress)
    manifest = read_manifest(src)
    if manifest is None:
        raise StorageError(
            f"{src.url} has no {MANIFEST_NAME}: it is not a complete clustertrain copy "
            "(a sync to it was interrupted, or it was not written by clustertrain); finish that sync first"
        )
    return manifest, 0


def plan_sync(
    src: ObjectStore, dst: ObjectStore, manifest: Manifest, *, delete: bool, jobs: int
) -> tuple[SyncPlan, dict[str, ObjectInfo], Manifest | None]:
    """Compare ``manifest`` with the destination; returns the plan, the listing and the old manifest."""
    for entry in manifest.files:
        check_key(entry.path, dst)
    previous = read_manifest(dst)
    listing = dst.list()
    recorded = previous.by_path() if previous else {}
    plan = SyncPlan(src=src.url, dst=dst.url)
    need_stat: list[ManifestEntry] = []
    for entry in manifest.files:
        obj = listing.get(entry.path)
        old = recorded.get(entry.path)
        if obj is None or obj.size != entry.size:
            plan.send.append(entry)
        elif obj.sha256 is not None:
            (plan.unchanged if obj.sha256 == entry.sha256 else plan.send).append(entry)
        elif old is not None and old.etag and old.etag != obj.etag:
            plan.send.append(entry)  # replaced behind our back since the last complete sync
        elif old is not None and old.sha256 == entry.sha256 and old.etag:
            plan.unchanged.append(entry)  # the very object the last complete sync wrote
        else:
            need_stat.append(entry)
    if need_stat:
        with ThreadPoolExecutor(jobs) as pool:
            stats = list(pool.map(lambda e: dst.stat(e.path), need_stat))
        for entry, info in zip(need_stat, stats):
            ok = info is not None and info.size == entry.size and info.sha256 == entry.sha256
            (plan.unchanged if ok else plan.send).append(entry)
    gone = sorted(set(listing) - {e.path for e in manifest.files})
    if delete and gone:
        unknown = [k for k in gone if k not in recorded and listing[k].sha256 is None]
        with ThreadPoolExecutor(jobs) as pool:
            tagged = {k for k, info in zip(unknown, pool.map(dst.stat, unknown)) if info and info.sha256}
        for key in gone:
            ours = key in recorded or listing[key].sha256 is not None or key in tagged
            (plan.delete if ours else plan.kept).append(key)
    else:
        plan.kept = gone
    plan.send.sort(key=lambda e: e.path)
    return plan, listing, previous


def _transfer(src: ObjectStore, dst: ObjectStore, entry: ManifestEntry) -> ObjectInfo:
    """Copy one entry; downloads are hashed before they are moved into place."""
    if isinstance(src, LocalPaths):
        return dst.put(src.path_of(entry.path), entry.path, entry.sha256)
    if isinstance(dst, LocalPaths):
        tmp = dst.partial_path(entry.path)
        try:
            _fetch_checked(src, entry, tmp)
            os.utime(tmp, ns=(entry.mtime_ns, entry.mtime_ns))
            return dst.commit(tmp, entry.path, entry.sha256)
        finally:
            tmp.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="ct-sync-") as tmpdir:
        tmp = Path(tmpdir) / "object"
        _fetch_checked(src, entry, tmp)
        return dst.put(tmp, entry.path, entry.sha256)


def _fetch_checked(src: ObjectStore, entry: ManifestEntry, target: Path) -> None:
    src.get(entry.path, target)
    digest = hash_file(target)
    if digest != entry.sha256:
        raise StorageError(
            f"{src.url}/{entry.path} is corrupt: sha256 {digest[:12]}... but the manifest says {entry.sha256[:12]}...; "
            f"run `clustertrain storage verify {src.url}`"
        )


def sync(
    src: str | Path | ObjectStore,
    dst: str | Path | ObjectStore,
    *,
    delete: bool = False,
    dry_run: bool = False,
    jobs: int = 8,
    options: StoreConfig | None = None,
    progress: bool = False,
) -> SyncResult:
    """Make ``dst`` a complete copy of ``src`` (see the module docstring); returns what was done."""
    if jobs < 1:
        raise StorageError(f"jobs must be at least 1 (got {jobs})")
    started = time.monotonic()
    source, dest = _as_store(src, options, progress), _as_store(dst, options, progress)
    if source.url == dest.url:
        raise StorageError(f"source and destination are the same ({source.url}); pick another destination")
    manifest, hashed = source_manifest(source, progress=progress)
    result = SyncResult(plan=SyncPlan(src=source.url, dst=dest.url), dry_run=dry_run, hashed_files=hashed)
    if not dry_run and isinstance(dest, IncompleteCleanup):
        result.cleaned_incomplete = dest.clean_incomplete()
    plan, listing, previous = plan_sync(source, dest, manifest, delete=delete, jobs=jobs)
    result.plan = plan
    if dry_run:
        result.seconds = time.monotonic() - started
        return result
    changing = bool(plan.send or plan.delete)
    if previous is not None and changing:
        dest.delete([MANIFEST_NAME])  # the copy is about to change: incomplete until the new manifest lands
    infos = _run_transfers(source, dest, plan.send, jobs, progress, result)
    if plan.delete:
        dest.delete(plan.delete)
        result.deleted = len(plan.delete)
    final = Manifest(  # the ETag each object has now (None where the store keeps none, as local files)
        files=[e.model_copy(update={"etag": (infos.get(e.path) or listing[e.path]).etag}) for e in manifest.files]
    )
    if changing or not final.same_files(previous):
        _write_manifest(dest, final)
        result.manifest_written = True
    result.seconds = time.monotonic() - started
    return result


def _run_transfers(
    src: ObjectStore, dst: ObjectStore, entries: list[ManifestEntry], jobs: int, progress: bool, result: SyncResult
) -> dict[str, ObjectInfo]:
    """Move ``entries`` with ``jobs`` workers; the first failure stops the rest and is raised."""
    infos: dict[str, ObjectInfo] = {}
    if not entries:
        return infos
    with make_progress(progress) as bar, ThreadPoolExecutor(jobs) as pool:
        task = bar.add_task(f"{src.url} -> {dst.url}", total=sum(e.size for e in entries))
        # largest first: a big file started last would run alone at the end (small ones fill in around it)
        ordered = sorted(entries, key=lambda e: e.size, reverse=True)
        futures = {pool.submit(_transfer, src, dst, e): e for e in ordered}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for fut in done:
                if fut.exception() is not None:
                    for other in pending:
                        other.cancel()
                    raise fut.exception()
                entry = futures[fut]
                infos[entry.path] = fut.result()
                result.transferred_files += 1
                result.transferred_bytes += entry.size
                bar.advance(task, entry.size)
    return infos


def _write_manifest(dst: ObjectStore, manifest: Manifest) -> None:
    text = manifest.to_json()
    with tempfile.TemporaryDirectory(prefix="ct-manifest-") as tmp:
        path = Path(tmp) / MANIFEST_NAME
        path.write_text(text, encoding="utf-8")
        dst.put(path, MANIFEST_NAME, hashlib.sha256(text.encode("utf-8")).hexdigest())
