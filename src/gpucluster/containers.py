"""Container images and mounts of a job: their syntax, and the policy's allowed mount roots.

Why here, apart from the executor: the API refuses a bad image reference or a mount outside the
policy's roots at submit (422, one line), long before a node would try it; the executor only
turns a valid spec into a `podman run` command line (executors/podman.py). No I/O but
`local_image`, the CLI's.

An image is a registry reference (`python:3.11`, `ghcr.io/org/img:tag`, `img@sha256:...`) or a
local archive through a transport podman reads without a registry (`docker-archive:/abs/env.tar`,
`oci-archive:/abs/env.tar`, `oci:/abs/dir`), so air-gapped clusters work. The CLI turns a path
(`./env.tar`) into `docker-archive:` or `oci-archive:` with an absolute path.

A mount is `SRC:DST[:ro|rw]`, both absolute; SRC must lie under one of the policy's
`containers: mount_roots:` (none by default: no mounts at all). The root check is on the path as
written (normalised): the node mounts it as the job's own Unix account, so a link under a root
leads nowhere that account could not already read.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_IMAGE_CHARS = 1024
MAX_MOUNTS = 32
ARCHIVE_TRANSPORTS = ("docker-archive:", "oci-archive:", "oci:")
# Where a mount may not go: the container's own kernel views.
RESERVED_TARGETS = ("/proc", "/sys", "/dev")

# The distribution spec's reference grammar, shortened: [host[:port]/]name[/name...][:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
_REFERENCE = re.compile(rf"{_HOST}?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?")
_PATH_CHARS = re.compile(r"[^\x00-\x1f\x7f,:]+")  # podman's -v splits on ':' and ','


def check_image(image: str) -> str:
    """The image reference, or ValueError saying what a valid one looks like."""
    if not image or len(image) > MAX_IMAGE_CHARS:
        raise ValueError(f"image must be 1-{MAX_IMAGE_CHARS} characters")
    for transport in ARCHIVE_TRANSPORTS:
        if image.startswith(transport):
            path = image[len(transport) :].split(":", 1)[0]
            if not path.startswith("/") or "\x00" in image:
                example = f"{transport}/data/env.tar"
                raise ValueError(f"image {image!r}: a {transport[:-1]} needs an absolute path, e.g. {example}")
            return image
    if image.startswith("docker://"):
        image = image[len("docker://") :]
    if not _REFERENCE.fullmatch(image):
        raise ValueError(
            f"image {image!r} is not a valid reference; write NAME[:TAG] or HOST/NAME[:TAG][@sha256:DIGEST] "
            "(lower case names), or docker-archive:/abs/path.tar for a local archive"
        )
    return image


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False

    def __str__(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


def _clean_path(path: str, what: str, item: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"mount {item!r}: {what} must be an absolute path")
    if not _PATH_CHARS.fullmatch(path):
        raise ValueError(f"mount {item!r}: {what} may not contain ',', ':' or control characters")
    if ".." in path.split("/"):
        raise ValueError(f"mount {item!r}: {what} may not contain '..'")
    return posixpath.normpath(path)


def parse_mount(item: str) -> Mount:
    """`SRC:DST[:ro|rw]` -> Mount, or ValueError naming the mistake."""
    parts = item.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"mount {item!r}: write SRC:DST or SRC:DST:ro (absolute paths)")
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise ValueError(f"mount {item!r}: the mode is ro or rw, not {mode!r}")
    source = _clean_path(parts[0], "the source", item)
    target = _clean_path(parts[1], "the target", item)
    if target == "/" or any(target == r or target.startswith(r + "/") for r in RESERVED_TARGETS):
        raise ValueError(f"mount {item!r}: the target may not be / nor under {', '.join(RESERVED_TARGETS)}")
    return Mount(source, target, mode == "ro")


def check_mounts(items: Sequence[str]) -> list[Mount]:
    if len(items) > MAX_MOUNTS:
        raise ValueError(f"at most {MAX_MOUNTS} mounts")
    mounts = [parse_mount(i) for i in items]
    targets = [m.target for m in mounts]
    if len(set(targets)) != len(targets):
        raise ValueError("two mounts have the same target")
    return mounts


def under(path: str, root: str) -> bool:
    root = posixpath.normpath(root)
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def outside_roots(mounts: Sequence[Mount], roots: Sequence[str]) -> str | None:
    """Why one of `mounts` is refused by the policy, or None when all lie under its roots."""
    for m in mounts:
        if not any(under(m.source, r) for r in roots):
            allowed = ", ".join(roots) if roots else "none: the policy allows no mounts"
            return (
                f"{m.source} is outside the directories this cluster lets jobs mount ({allowed}); "
                "mount a directory under one of them, or ask a cluster admin to add it to the policy's "
                "containers: mount_roots:"
            )
    return None


def stored_name(image: str) -> str | None:
    """How a node's podman store lists a registry reference: no `docker://`, `:latest` when it names
    no tag or digest; None for an archive (loaded anew by each launch, kept by no name). The one
    key of the image cache (executors/image_cache.py) and of placement's image affinity
    (core/image_affinity.py), so `x` and `docker://x:latest` are the same image to both. An
    unqualified name (`python:3.11`) is listed under the registry podman resolved it to, so the
    cache never finds it in the store listing (and never removes it)."""
    if image.startswith(ARCHIVE_TRANSPORTS):
        return None
    ref = image.removeprefix("docker://")
    if "@" not in ref and ":" not in ref.rsplit("/", 1)[-1]:
        ref += ":latest"
    return ref


def local_image(image: str, base: Path) -> str:
    """What the CLI sends for `--image`: a path (./env.tar, /abs/env.tar, ~/env.tar, x.tar) becomes
    an archive transport with an absolute path (oci-archive: when the tar holds an OCI layout, else
    docker-archive:, what `podman save` writes); anything else is sent as written.

    The one function here that reads a file: the archive's kind is known only on the submitting
    side, and the node reads the archive from the same path (a shared file system)."""
    is_path = image.startswith(("/", "./", "../", "~")) or image.endswith((".tar", ".tar.gz", ".tgz"))
    if image.startswith((*ARCHIVE_TRANSPORTS, "docker://")) or not is_path:
        return image
    import tarfile  # only for a path: the CLI starts without it (issue 19)

    path = (base / Path(image).expanduser()).absolute()
    kind = "docker-archive:"
    try:
        with tarfile.open(path) as tar:
            if any(n.lstrip("./") == "oci-layout" for n in tar.getnames()):
                kind = "oci-archive:"
    except (OSError, tarfile.TarError):
        pass  # the node says what is wrong with it, as the job's failure
    return f"{kind}{path}"
