"""Commit + push time as the git history grows: 1,000 -> 10,000 record commits.

History is created fast with `git fast-import` straight into a bare origin (each commit: one machine record
written by the bot, with the bot's identity and Fleet-* trailers, over a fleet of 3,000 machines). Then a
bot clone times `GitStore.publish` of one new record commit, pushed to the origin - the git part of every
reconcile pass that changed something: fetch, checkout, clean, trailer_values (as run_pass calls it),
write, commit, push. Measured at 1,000 commits, the origin grown to 10,000, measured again; ratio reported.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import Figure, fast_import_data, git, median_time, timed
from bench.data import DIGEST, machine_id_of, machine_records, spec_yaml
from reconciler.adapters.git import BOT_EMAIL, BOT_NAME, CommitRequest, FileChange, GitStore
from reconciler.adapters.record_files import render_machine_record

SIZES = (1_000, 10_000)
#: Machines in the fleet: (a) a steady fleet: only history grows; (b) the fleet grows with it (more record files).
SCENARIOS = ((1_000, "steady fleet of 1,000 machines"), (3_000, "fleet growing to 3,000 machines"))
TARGET_RATIO = 1.3  # issue 16: commit+push growth 1k -> 10k commits in a growing fleet




class History:
    """Writes bot record commits into a bare repo with fast-import, continuing where it left off."""

    def __init__(self, bare: Path, fleet_machines: int):
        self.bare = bare
        self.fleet_machines = fleet_machines
        self.commits = 0
        # A handful of real rendered records; each commit changes ids so every blob is distinct.
        self.templates = [render_machine_record(r) for r in machine_records(8, 2)]
        self.clock = 1_760_000_000

    def seed(self) -> None:
        stream = b"commit refs/heads/main\n" + self._who() + fast_import_data("seed: fleet spec") + \
            b"M 100644 inline fleet-spec/fleet.yaml\n" + fast_import_data(spec_yaml()) + \
            b"M 100644 inline README.md\n" + fast_import_data("fleet\n")
        git(self.bare, "fast-import", "--quiet", stdin=stream)

    def _who(self) -> bytes:
        self.clock += 60
        return (f"author {BOT_NAME} <{BOT_EMAIL}> {self.clock} +0000\n"
                f"committer {BOT_NAME} <{BOT_EMAIL}> {self.clock} +0000\n").encode()

    def grow(self, count: int) -> None:
        parts = []
        for _ in range(count):
            n = self.commits
            mid = machine_id_of((n * 7919) % self.fleet_machines)
            template = self.templates[n % len(self.templates)]
            text = template.replace("machine_id: '1000", f"machine_id: 'x{n}").replace(
                template.split("machine_id: '", 1)[1].split("'", 1)[0], mid)
            instance = f"rtx4090-a-{n % 1000}-{n:06x}"
            message = (f"fleet: 1 verdict (1 bad: machine {mid} below-min-rate 21.0/h < 40/h (171.4 s/proof))\n\n"
                       f"- machine {mid} (host 7{n % 997}, RTX 4090, pool rtx4090-a) instance {instance}: "
                       f"below-min-rate\n\nFleet-Machine: {mid}\nFleet-Verdict: below-min-rate\n"
                       f"Fleet-Instance: {instance}\n")
            parts.append(b"commit refs/heads/main\n" + self._who() + fast_import_data(message)
                         + (b"from refs/heads/main^0\n" if not parts else b"")
                         + f"M 100644 inline fleet-spec/machines/{mid}.yaml\n".encode() + fast_import_data(text))
            self.commits += 1
        git(self.bare, "fast-import", "--quiet", stdin=b"".join(parts))


def _publish_one(store: GitStore, n: int) -> None:
    mid = f"9{n:06d}"
    record = f"machine_id: '{mid}'\nstatus: bad\nbenchmarks: []\nimage: {DIGEST}\n"

    def build(_workdir: Path) -> CommitRequest:
        store.trailer_values("Fleet-Instance")  # what run_pass asks for on every pass
        return CommitRequest(f"fleet: 1 verdict (machine {mid})", "", (("Fleet-Machine", mid),
                                                                        ("Fleet-Instance", f"bench-{n}")),
                             (FileChange(f"fleet-spec/machines/{mid}.yaml", record),))

    result = store.publish(build)
    if not result.pushed:
        raise RuntimeError(f"bench publish {n} did not push: {result}")


def run(repeats: int = 5) -> list[Figure]:
    figures = []
    for fleet_machines, label in SCENARIOS:
        figures += _scenario(fleet_machines, label, repeats)
    return figures


def _scenario(fleet_machines: int, label: str, repeats: int) -> list[Figure]:
    figures = []
    with tempfile.TemporaryDirectory(prefix="bench-git-") as tmp:
        root = Path(tmp)
        bare = root / "origin.git"
        git(root, "init", "--quiet", "--bare", "--initial-branch=main", str(bare))
        history = History(bare, fleet_machines)
        history.seed()
        medians: dict[int, float] = {}
        published = 0
        bot = root / "bot"
        for size in SIZES:
            grow_s = timed(lambda size=size: history.grow(size - history.commits))
            if not bot.exists():
                git(root, "clone", "--quiet", str(bare), str(bot))
            store = GitStore(bot, sleep=lambda _s: None, max_attempts=1)
            cold = timed(lambda store=store: (store.sync(), store.trailer_values("Fleet-Instance")))
            fresh = GitStore(bot, sleep=lambda _s: None, max_attempts=1)
            cold_trailers = timed(lambda fresh=fresh: fresh.trailer_values("Fleet-Instance"))
            _publish_one(store, published)  # warm-up: page cache, trailer cache
            published += 1
            times = []
            for _ in range(repeats):
                times.append(timed(lambda store=store, n=published: _publish_one(store, n)))
                published += 1
            medians[size] = sorted(times)[len(times) // 2]
            files = len(git(bot, "ls-files", "fleet-spec/machines").splitlines())
            ls_tree = median_time(lambda: git(bot, "ls-tree", "-r", "HEAD", "fleet-spec/machines"), 3)
            figures.append(Figure(
                f"commit+push one record, {size:,} record commits ({label})", medians[size], "s",
                f"median of {repeats} GitStore.publish (fetch, checkout, clean, trailer_values, write, commit, push);"
                f" {files:,} record files in the tree; history built by fast-import in {grow_s:.1f} s"))
            figures.append(Figure(f"  trailer_values, cold (whole history), {size:,} commits", cold_trailers, "s",
                                  f"first pass after a restart; sync + cold read {cold:.2f} s; later passes read "
                                  "only new commits"))
            figures.append(Figure(f"  git ls-tree of {files:,} record files", ls_tree * 1000, "ms",
                                  "cost of checking which record blobs changed (for a parsed-record cache)"))
        ratio = medians[SIZES[-1]] / medians[SIZES[0]]
        figures.append(Figure(f"commit time growth 1k -> 10k record commits ({label})", ratio, "x",
                              f"{medians[SIZES[0]]:.3f} s -> {medians[SIZES[-1]]:.3f} s",
                              target=f"<= {TARGET_RATIO:g}x", passed=ratio <= TARGET_RATIO))
    return figures


if __name__ == "__main__":
    start = time.perf_counter()
    for f in run():
        print(f.name, "|", f.shown(), "|", f.detail, f.verdict())
    print(f"{time.perf_counter() - start:.1f} s")
