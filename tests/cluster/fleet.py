"""The three local control planes of the multi-cluster tests: a manager and two workers
(`<cluster>-manager`, `-w1`, `-w2`; 2 nodes x 8 GPUs each, the AppWrapper CRD installed).
Started once per run for every module that uses them (the ``fleet_clusters`` fixture) and
stopped at its end, unless they were running before it or ``DISPATCHER_KEEP_CLUSTER=1``."""

from __future__ import annotations

from dataclasses import dataclass

from localcluster import Cluster
from localcluster import config as lc_config

from .dispatcher_process import install_crd

WORKERS = ("w1", "w2")


@dataclass
class FleetClusters:
    manager: Cluster
    workers: dict[str, Cluster]
    #: Those of them already up before this run: left running at its end.
    were_running: frozenset[str]

    @classmethod
    def named(cls) -> FleetClusters:
        base = lc_config.cluster_name()
        manager = Cluster(f"{base}-manager")
        workers = {w: Cluster(f"{base}-{w}") for w in WORKERS}
        running = frozenset(c.name for c in (manager, *workers.values()) if c.is_running())
        return cls(manager, workers, running)

    def all(self) -> tuple[Cluster, ...]:
        return (self.manager, *self.workers.values())

    def up(self) -> None:
        """Each one up (one a module before left broken is started again)."""
        for c in self.all():
            c.up(profile="pool", operators=False)
            install_crd(c.kubectl())

    def down(self) -> None:
        """Each started here stopped, even if stopping another fails."""
        failures = []
        for c in self.all():
            if c.name not in self.were_running:
                try:
                    c.down()
                except Exception as e:  # the others are stopped all the same
                    failures.append(f"{c.name}: {e}")
        if failures:
            raise RuntimeError("could not stop " + "; ".join(failures))
