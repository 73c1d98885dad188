"""Parallel layout rules, checked when a job file is loaded (validate, render, submit).

The job file's optional ``parallelism`` section (tp, ep, etp, cp, hsdp, ep_scope,
nvlink_domain_size) is checked against the world: ``nodes x nproc_per_node`` ranks, one per GPU.
A trainer would reject these layouts only after the allocation is paid for; the rules are the
Halo toolkit's (DOMAIN.md, "Layout rules"):

- every size divides the world (and tp x cp, ep x etp do too);
- above one NVLink domain, EP together with TP must be ONE EP group spanning the job: on 2x8 GPUs
  ``ep: 8, tp: 2`` forms two EP groups and is refused, ``ep: 16, tp: 2`` (ep_scope global, or
  auto, which goes global once EP outgrows the domain) runs; pure EP has no such rule;
- HSDP covers pure DP or CP only (tp, ep, etp reject it), and inside one domain it does nothing
  (a warning, not an error);
- ``ep_scope: node`` cannot hold an EP group larger than the domain.

The domain is counted in ranks: ``nvlink_domain_size`` (72 on an NVL72 rack), by default one
node's ranks (``nproc_per_node``, which is ``gpus_per_node`` with one rank per GPU).

Every rank gets the values as environment (``HALO_PARALLEL_*``, ``NVLINK_DOMAIN_SIZE``), so a
trainer reads the same layout the rules passed. No torch, no I/O.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class LayoutWarning(UserWarning):
    """A layout that runs but not as the user likely means (HSDP inside one domain)."""


class Layout(NamedTuple):
    world: int
    nodes: int
    per_node: int
    domain: int
    tp: int
    ep: int
    etp: int
    cp: int
    hsdp: bool
    ep_scope: str  # as written: auto | node | global

    @classmethod
    def of(cls, spec: Any) -> "Layout | None":
        p = spec.parallelism
        if p is None:
            return None
        return cls(world=spec.nodes * spec.nproc_per_node, nodes=spec.nodes, per_node=spec.nproc_per_node,
                   domain=p.nvlink_domain_size or spec.nproc_per_node, tp=p.tp, ep=p.ep, etp=p.etp, cp=p.cp,
                   hsdp=p.hsdp, ep_scope=p.ep_scope)

    @property
    def single_domain(self) -> bool:
        return self.world <= self.domain

    @property
    def resolved_ep_scope(self) -> str:
        """auto goes global once the EP group outgrows the NVLink domain."""
        if self.ep_scope != "auto":
            return self.ep_scope
        return "global" if self.ep > self.domain else "node"

    @property
    def dp(self) -> int:
        return max(1, self.world // (self.tp * self.cp))

    @property
    def ep_crosses_nodes(self) -> bool:
        """Whether an EP group's all-to-all leaves a node (needs an RDMA fabric; EFA: GDR)."""
        return self.ep > 1 and self.nodes > 1 and (self.ep > self.per_node or self.resolved_ep_scope == "global")

    def where(self) -> str:
        return f"{self.world} ranks ({self.nodes} node{'s' if self.nodes != 1 else ''} x {self.per_node})"


Problem = tuple[str, str]  # (field, message)


def check(spec: Any) -> tuple[list[Problem], list[Problem]]:
    """(errors, warnings) of the spec's parallelism section; both empty without one."""
    lay = Layout.of(spec)
    if lay is None:
        return [], []
    errors: list[Problem] = []
    warns: list[Problem] = []
    world = lay.where()

    if lay.world > lay.domain and lay.world % lay.domain:
        errors.append(("parallelism.nvlink_domain_size",
                       f"{lay.domain} does not divide the world of {world}: NVLink domains must tile the job"))
    if lay.domain % lay.per_node and lay.per_node % lay.domain:
        errors.append(("parallelism.nvlink_domain_size",
                       f"{lay.domain} ranks neither hold whole nodes ({lay.per_node} ranks each) nor divide one"))

    for name in ("tp", "ep", "etp", "cp"):
        v = getattr(lay, name)
        if lay.world % v:
            errors.append((f"parallelism.{name}", f"{name}={v} does not divide the world of {world}"))
    if not (lay.world % lay.tp or lay.world % lay.cp) and lay.world % (lay.tp * lay.cp):
        errors.append(("parallelism.cp", f"tp x cp = {lay.tp * lay.cp} does not divide the world of {world}"))
    if not (lay.world % lay.ep or lay.world % lay.etp) and lay.world % (lay.ep * lay.etp):
        errors.append(("parallelism.etp", f"ep x etp = {lay.ep * lay.etp} does not divide the world of {world}"))

    if lay.hsdp:
        others = [f"{n}={getattr(lay, n)}" for n in ("tp", "ep", "etp") if getattr(lay, n) > 1]
        if others:
            errors.append(("parallelism.hsdp",
                           f"HSDP covers pure data parallelism (or cp) only; {', '.join(others)} rejects it: "
                           "drop hsdp or those sizes"))
        elif lay.single_domain:
            warns.append(("parallelism.hsdp",
                          f"the job fits one NVLink domain (a world of {world}, nvlink_domain_size {lay.domain}): "
                          "HSDP shards and replicates inside it, which does nothing"))

    if lay.ep_scope == "node" and lay.ep > lay.domain:
        errors.append(("parallelism.ep_scope",
                       f"node keeps each EP group inside one NVLink domain ({lay.domain} ranks), but ep={lay.ep} "
                       "is larger: use ep_scope global (or auto)"))
    elif lay.ep > 1 and lay.tp > 1 and not lay.single_domain and lay.ep != lay.world and not lay.world % lay.ep:
        errors.append(("parallelism.ep",
                       f"with tp={lay.tp} above one NVLink domain (a world of {world}, nvlink_domain_size {lay.domain}), EP "
                       f"must be one group spanning the job (ep={lay.world}, ep_scope global); ep={lay.ep} forms "
                       f"{lay.world // lay.ep} EP groups"))

    net = spec.network
    if (net.fabric == "efa" and lay.ep_crosses_nodes
            and not net.cross_node_expert_parallel):
        warns.append(("network.cross_node_expert_parallel",
                      f"EP groups of {lay.ep} cross nodes on EFA: set it true (NCCL_GIN_TYPE=2, /dev/gdrdrv)"))
    return errors, warns


def environment(spec: Any) -> dict[str, str]:
    """The layout every rank reads, identical on all (empty without a parallelism section)."""
    lay = Layout.of(spec)
    if lay is None:
        return {}
    return {
        "HALO_PARALLEL_TP": str(lay.tp),
        "HALO_PARALLEL_EP": str(lay.ep),
        "HALO_PARALLEL_ETP": str(lay.etp),
        "HALO_PARALLEL_CP": str(lay.cp),
        "HALO_PARALLEL_DP": str(lay.dp),
        "HALO_PARALLEL_HSDP": "1" if lay.hsdp else "0",
        "HALO_PARALLEL_EP_SCOPE": lay.resolved_ep_scope,
        # The Halo toolkit's own name for the domain (72 on an NVL72 rack).
        "NVLINK_DOMAIN_SIZE": str(lay.domain),
    }
