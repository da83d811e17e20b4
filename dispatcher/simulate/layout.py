"""A topology for `dispatcher simulate --topology FILE`: the nodes and their labels.

The file (YAML or JSON) has the configuration file's ``topology:`` section (the levels,
or Kueue's Topology object) and the nodes, each with its labels; ``count`` repeats an
entry (its nodes are named NAME-0, NAME-1, ...). Every node has ``--gpus-per-node``
GPUs, as the generated nodes do::

    topology:
      levels: [cloud.provider.com/topology-block, cloud.provider.com/topology-rack]
    nodes:
    - name: b1-r1
      count: 16
      labels: {cloud.provider.com/topology-block: b1, cloud.provider.com/topology-rack: r1}

The report counts the domains of the innermost level above the nodes themselves (not
``kubernetes.io/hostname``), and ``--require-rack`` asks for one of them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dispatcher import yaml_text
from dispatcher.config import TopologyLevels
from dispatcher.fit.topology import Topology
from dispatcher.simulate.engine import Layout, gpu_nodes
from dispatcher.simulate.traces import TraceError

HOSTNAME = "kubernetes.io/hostname"


class _Nodes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    count: int = Field(default=1, ge=1)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topology: TopologyLevels
    nodes: list[_Nodes] = Field(min_length=1)


def read_layout(path: Path, gpus_per_node: int) -> Layout:
    """The nodes and levels of a topology file; a TraceError says what to fix."""
    try:
        data = yaml_text.load(yaml_text.read(path), str(path))
    except (OSError, yaml.YAMLError) as e:
        raise TraceError(f"{path}: cannot read the topology: {e}") from e
    try:
        f = _File.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'the file'}: {err['msg']}"
                             for err in e.errors())
        raise TraceError(f"{path}: {problems} (expected topology: and nodes:, see "
                         "docs/topology.md)") from e
    levels = f.topology.levels
    counted = [x for x in levels if x != HOSTNAME]
    if not counted:
        raise TraceError(f"{path}: topology.levels names no level above the nodes (a rack, "
                         "a block...)")
    names = [n.name if n.count == 1 else f"{n.name}-{i}" for n in f.nodes
             for i in range(n.count)]
    twice = sorted(x for x, k in Counter(names).items() if k > 1)
    if twice:
        raise TraceError(f"{path}: nodes named twice: {', '.join(twice[:5])}")
    labels = [n.labels for n in f.nodes for _ in range(n.count)]
    plain = gpu_nodes(len(names), gpus_per_node)
    nodes = tuple(replace(node, name=name, labels={HOSTNAME: name, **mine})
                  for node, name, mine in zip(plain, names, labels, strict=True))
    return Layout(nodes, Topology(tuple(levels)), counted[-1])
