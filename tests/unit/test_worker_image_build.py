"""The worker image's build definition and the stand-ins' provenance, checked without docker: one pinned
curio commit everywhere, the real build as issue 13 specifies it, both daemon names, every line the
stand-ins print cites its source."""

from __future__ import annotations

import re
from pathlib import Path

from reconciler import REPO_ROOT

IMAGE = REPO_ROOT / "worker-image"
DOCKERFILE = (IMAGE / "Dockerfile").read_text()
LIB = (IMAGE / "standin" / "standin-lib.sh").read_text()
PIN = "e0294b0f948132d41e8f42f59fa949495d5fd3af"


def stages() -> list[str]:
    return re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE, re.M)


def test_stages_put_the_standin_first_and_the_real_image_last() -> None:
    # The legacy builder builds every stage up to the target: the stand-in target must not need the CUDA
    # builder; the default (last) target is the real one.
    assert stages() == ["standin", "cuzk-build", "real"]


def test_the_real_build_is_the_pinned_curio_with_rust_186_and_protoc() -> None:
    assert set(re.findall(r"^ARG CURIO_COMMIT=(\S+)$", DOCKERFILE, re.M)) == {PIN}
    assert f"STANDIN_CURIO_COMMIT={PIN}" in LIB
    assert "ARG RUST_VERSION=1.86.0" in DOCKERFILE
    assert "protobuf-compiler" in DOCKERFILE
    assert "cargo build --release --locked --bin cuzk-daemon --bin cuzk-bench" in DOCKERFILE
    assert re.search(r"^ARG BUILDER_IMAGE=nvidia/cuda:\S+-devel-", DOCKERFILE, re.M)
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:\S+-runtime-", DOCKERFILE, re.M)
    # curio's `make install-cuzk` name and the cargo name both exist in the real image.
    assert "ln -s cuzk-daemon /usr/local/bin/cuzk" in DOCKERFILE


def test_the_workflow_builds_the_real_target() -> None:
    workflow = (REPO_ROOT / ".github" / "workflows" / "worker-image.yml").read_text()
    assert "--target real" in workflow and "worker-image" in workflow


def test_cuzk_is_the_daemon_stand_in_too() -> None:
    link = IMAGE / "standin" / "cuzk"
    assert link.is_symlink() and link.resolve() == (IMAGE / "standin" / "cuzk-daemon").resolve()


def statements(path: Path) -> list[tuple[int, str, str]]:
    """(line number, statement with continuations joined, previous line) of a shell script."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        start, text = i, lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + lines[i]
        out.append((start + 1, text, lines[start - 1] if start else ""))
        i += 1
    return out


CITATION = re.compile(r"#.*(\.rs|\.cu|\.cuh|\.toml|\.mk)(:\d+| \()")


def test_every_printed_cuzk_line_cites_its_source() -> None:
    missing = []
    for name in ("cuzk-daemon", "cuzk-bench"):
        for number, text, previous in statements(IMAGE / "standin" / name):
            code = text.split(" #")[0].strip()
            prints = code.startswith(("standin_trace ", "echo ", "printf ")) and not code.startswith("printf -v")
            to_file = re.search(r">>?\s*\"?\$", code) is not None
            cited = CITATION.search(text) or CITATION.search(previous)
            if prints and not to_file and "[gpu-fleet stand-in]" not in code and not cited:
                missing.append(f"{name}:{number}: {code[:100]}")
    assert missing == []
