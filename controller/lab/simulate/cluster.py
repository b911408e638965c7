"""Cluster identity and rank placement: physical nodes with their GPUs, and how a job's ranks map
onto them.

Ranks follow Megatron's default order (tensor parallel fastest, then data parallel, then pipeline
stage), with the tensor-parallel group filling one node: rank = tp + tp_size * (dp + dp_size * pp).
A pipeline stage is therefore a contiguous block of nodes, which is why a slow stage looks like
"several slow nodes" unless the pp_rank is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# PCI bus numbers of the eight GPUs of an HGX H100 baseboard, in NVML index order.
HGX_BUSES = (
    "18",
    "2A",
    "3A",
    "5D",
    "9A",
    "AB",
    "BA",
    "DB",
    "1B",
    "2B",
    "3B",
    "5E",
    "9B",
    "AC",
    "BB",
    "DC",
)
GPU_NAME = "NVIDIA H100 80GB HBM3"
MEM_TOTAL_BYTES = 81_559 * 1024 * 1024


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    pci_bus_id: str  # NVML form 00000000:BB:DD.F

    @property
    def kmsg_pci(self) -> str:
        """The domain:bus:device form the driver prints in Xid lines (PCI:0000:9a:00)."""
        domain, bus, devfn = self.pci_bus_id.split(":")
        return f"{domain[-4:]}:{bus.lower()}:{devfn.split('.')[0].lower()}"


@dataclass(frozen=True)
class Node:
    name: str
    ip: str
    gpus: tuple[Gpu, ...]


def _uuid(rng: np.random.Generator) -> str:
    raw = rng.integers(0, 256, size=16, dtype=np.uint8).tobytes().hex()
    return f"GPU-{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"


def make_nodes(
    count: int, gpus_per_node: int, rng: np.random.Generator, first: int = 0
) -> list[Node]:
    nodes = []
    for i in range(first, first + count):
        gpus = tuple(
            Gpu(g, _uuid(rng), f"00000000:{HGX_BUSES[g]}:00.0") for g in range(gpus_per_node)
        )
        nodes.append(Node(f"node-{i:03d}", f"10.{64 + i // 250}.{i % 250}.{11 + (i % 7)}", gpus))
    return nodes


@dataclass(frozen=True)
class RankPlace:
    rank: int
    node: Node
    local_rank: int
    tp_rank: int
    dp_rank: int
    pp_rank: int

    @property
    def gpu(self) -> Gpu:
        return self.node.gpus[self.local_rank]


@dataclass(frozen=True)
class Placement:
    """Where every rank of one attempt runs. `nodes[i]` hosts ranks i*tp .. i*tp+tp-1."""

    nodes: tuple[Node, ...]
    tp_size: int
    pp_size: int

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.tp_size

    @property
    def dp_size(self) -> int:
        return len(self.nodes) // self.pp_size

    def place(self, rank: int) -> RankPlace:
        node_slot, tp = divmod(rank, self.tp_size)
        pp, dp = divmod(node_slot, self.dp_size)
        return RankPlace(rank, self.nodes[node_slot], tp, tp, dp, pp)

    def ranks(self) -> list[RankPlace]:
        return [self.place(r) for r in range(self.world_size)]

    def node_slot(self, node_name: str) -> int:
        for slot, node in enumerate(self.nodes):
            if node.name == node_name:
                return slot
        raise KeyError(node_name)

    def ranks_of_node(self, node_name: str) -> list[int]:
        slot = self.node_slot(node_name)
        return list(range(slot * self.tp_size, (slot + 1) * self.tp_size))

    def stage_of_rank(self) -> np.ndarray:
        return (np.arange(self.world_size) // self.tp_size) // self.dp_size

    def dp_of_rank(self) -> np.ndarray:
        return (np.arange(self.world_size) // self.tp_size) % self.dp_size

    def replace(self, node_name: str, spare: Node) -> Placement:
        nodes = tuple(spare if n.name == node_name else n for n in self.nodes)
        return Placement(nodes, self.tp_size, self.pp_size)

    # process groups, as Megatron builds them
    # -------------------------------------------------------------
    def tp_groups(self) -> list[tuple[int, ...]]:
        return [
            tuple(range(s * self.tp_size, (s + 1) * self.tp_size)) for s in range(len(self.nodes))
        ]

    def dp_groups(self) -> list[tuple[int, ...]]:
        groups = []
        for pp in range(self.pp_size):
            for tp in range(self.tp_size):
                groups.append(
                    tuple(
                        tp + self.tp_size * (dp + self.dp_size * pp) for dp in range(self.dp_size)
                    )
                )
        return groups

    def pp_groups(self) -> list[tuple[int, ...]]:
        groups = []
        for dp in range(self.dp_size):
            for tp in range(self.tp_size):
                groups.append(
                    tuple(
                        tp + self.tp_size * (dp + self.dp_size * pp) for pp in range(self.pp_size)
                    )
                )
        return groups


def initial_placement(nodes: Sequence[Node], tp_size: int, pp_size: int) -> Placement:
    return Placement(tuple(nodes), tp_size, pp_size)
