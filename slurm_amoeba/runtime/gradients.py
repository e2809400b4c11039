"""Gradient reduction of the elastic runtime: flat buckets, the control word, and overlap with backward.

Every gradient of the model is a view into a few flat buffers (one per dtype and device), so the reduction needs
no copies. The buffers are cut into buckets in reverse parameter order (the order in which backward produces
gradients): a first small bucket, then large ones, like ``DistributedDataParallel``. The last bucket ends with the
*control word* — one extra element each rank sets to 1 when it knows of a pending membership change; after the
all-reduce every rank reads the same sum, so all agree on the switch step at no extra cost.

During the last micro-batch of a step (the loader calls :meth:`GradientBuckets.arm` before it), a bucket is
all-reduced asynchronously as soon as backward has produced all of its gradients, overlapping communication with
the rest of backward. Buckets are always launched in the same fixed order on every rank, whatever order their
gradients arrive in, so the collectives match across ranks; :meth:`GradientBuckets.finish` launches what is left
and waits.

In the first step of a generation whose joiners take no samples while they receive the state (runtime/topology.py,
``idle_ranks``), :meth:`GradientBuckets.reduce_without` sums the members' gradients point to point at one member and
sends the sum to everyone: the members do not wait in a collective for joiners that are still receiving; the
joiners pick up the summed gradient when they are ready, and step their optimizer with it like everyone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.runtime.gns import NormProbe

FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 25 << 20
#: Tags of the gradient buffers' point-to-point messages (:meth:`GradientBuckets.reduce_without`), above the state
#: transfer's (one per dtype, from 0).
GRADIENT_TAG = 1 << 12

#: Sends still in flight with the buffers they read (referenced until done).
Sends = list[tuple[Any, torch.Tensor]]


@dataclasses.dataclass
class _Bucket:
    tensor: torch.Tensor
    params: list[torch.nn.Parameter]
    pending: int = 0
    work: Any = None


class GradientBuckets:
    """The model's gradients as bucketed views into flat buffers, reduced with a control word.

    Args:
        model: the model; parameters that do not require gradients are left alone.
        first_bucket_bytes: size of the first bucket (the gradients of the last layers).
        bucket_bytes: size of the other buckets.
        probe: measures the gradient's squared norms before and after the reduce (adaptive batch; ``gns``); its
            slots ride before the control word.

    Raises:
        RuntimeConfigError: the model has no parameter that requires a gradient.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        first_bucket_bytes: int = FIRST_BUCKET_BYTES,
        bucket_bytes: int = BUCKET_BYTES,
        probe: NormProbe | None = None,
    ) -> None:
        self.model = model
        self.probe = probe
        self._tail = 1 + (NormProbe.SLOTS if probe is not None else 0)  # control word (+ the probe's slots)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise RuntimeConfigError("the model has no parameter that requires a gradient: nothing to train")
        groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in reversed(self.params):
            groups.setdefault((p.dtype, p.device), []).append(p)
        self.flats: list[torch.Tensor] = []
        self.views: dict[int, torch.Tensor] = {}
        self.buckets: list[_Bucket] = []
        self._bucket_of: dict[int, _Bucket] = {}
        last_group = len(groups) - 1
        for index, ((dtype, device), params) in enumerate(groups.items()):
            control = self._tail if index == last_group else 0
            flat = torch.zeros(sum(p.numel() for p in params) + control, dtype=dtype, device=device)
            self.flats.append(flat)
            offset, start, members = 0, 0, []
            cap = first_bucket_bytes
            for position, p in enumerate(params):
                view = flat[offset : offset + p.numel()].view_as(p)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                self.views[id(p)] = view
                offset += p.numel()
                members.append(p)
                last = position == len(params) - 1
                if (offset - start) * flat.element_size() >= cap or last:
                    end = offset + (control if last else 0)
                    bucket = _Bucket(tensor=flat[start:end], params=members)
                    self.buckets.append(bucket)
                    for member in members:
                        self._bucket_of[id(member)] = bucket
                    start, members, cap = offset, [], bucket_bytes
        self.control = self.flats[-1][-1:]
        if probe is not None:
            probe.bind(self.flats[-1][-self._tail : -1])
        self._armed = False
        self._fired: set[int] = set()
        self._next = 0
        self._launch_error: RuntimeError | None = None
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_gradient)  # type: ignore[no-untyped-call]
            for p in self.params
        ]

    def close(self) -> None:
        """Remove the gradient hooks (when the model is replaced)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # ----------------------------------------------------------------------------------------------- overlap

    def arm(self, control: float) -> None:
        """Start reducing buckets as soon as backward fills them (call before the step's last micro-batch).

        Args:
            control: this rank's control word (1.0 for a pending change, else 0.0).
        """
        self.control.fill_(control)
        for bucket in self.buckets:
            bucket.pending, bucket.work = len(bucket.params), None
        self._fired.clear()
        self._next = 0
        self._launch_error = None
        self._armed = True
        if self.probe is not None:
            self.probe.on_arm(self.flats, self._tail)

    def _on_gradient(self, param: torch.Tensor) -> None:
        if not self._armed:
            return
        key = id(param)
        if key in self._fired:
            self._armed = False
            raise RuntimeConfigError(
                "a parameter received a second gradient in the last micro-batch of a step, after its bucket was "
                "sent for reduction: call backward() once per micro-batch (sum the losses first)"
            )
        self._fired.add(key)
        view = self.views[key]
        grad = param.grad
        if grad is None or grad.data_ptr() != view.data_ptr():
            if grad is not None:
                view.copy_(grad)
            param.grad = view
        self._bucket_of[key].pending -= 1
        self._launch_ready()

    def _launch(self, bucket: _Bucket) -> None:
        if self._launch_error is not None:
            return
        if self.probe is not None:
            self.probe.before_launch(bucket.tensor, last=bucket is self.buckets[-1], tail=self._tail)
        try:
            bucket.work = dist.all_reduce(bucket.tensor, async_op=True)
        except RuntimeError as exc:  # reported by finish(), outside autograd
            self._launch_error = exc

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._launch(self.buckets[self._next])
            self._next += 1

    # ----------------------------------------------------------------------------------------------- step

    def _capture(self, params: list[torch.nn.Parameter]) -> None:
        for p in params:
            view = self.views[id(p)]
            grad = p.grad
            if grad is None:
                view.zero_()
                p.grad = view
            elif grad.data_ptr() != view.data_ptr():
                view.copy_(grad)
                p.grad = view

    def finish(self, control: float) -> float:
        """Reduce whatever is not reduced yet, wait for every bucket, and return the summed control word.

        Args:
            control: this rank's control word, used when the step was not armed.

        Returns:
            The control word summed over all ranks.

        Raises:
            RuntimeError: a collective failed (the caller turns it into a worker failure).
        """
        if not self._armed:
            self.arm(control)
            if self.probe is not None:
                self.probe.on_arm(None, self._tail)
            for bucket in self.buckets:
                bucket.pending = 0
        # Gradients that never came through a hook (unused parameters, or a rank without samples this step).
        for bucket in self.buckets[self._next :]:
            self._capture(bucket.params)
            bucket.pending = 0
        self._launch_ready()
        self._armed = False
        try:
            if self._launch_error is not None:
                raise self._launch_error
            for bucket in self.buckets:
                if bucket.work is not None:
                    bucket.work.wait()
                    bucket.work = None
        except RuntimeError:
            self.abandon()
            raise
        if self.probe is not None:
            self.probe.after_reduce(self.flats, self._tail)
        return float(self.control.item())

    def reduce_without(
        self, rank: int, root: int, members: list[int], idle: list[int], control: float
    ) -> tuple[float, Sends]:
        """Reduce a step in which the ``idle`` ranks take no part: point to point, no collective.

        The members' gradients (and control words) are summed at ``root`` in rank order; ``root`` sends the sum to
        the other members, who wait for it, and to the idle ranks, without waiting: they receive it when they come
        to their own step (a joiner still receiving the state). An idle rank's own gradients are ignored (it has no
        samples in the step).

        Args:
            rank: this worker's rank.
            root: the member that sums (the plan's source).
            members: every rank that takes samples in the step (``root`` among them).
            idle: the other ranks.
            control: this rank's control word.

        Returns:
            The control word summed over the members, and ``root``'s sends to the idle ranks still in flight (they
            read a copy of the sum: wait for them before the next collective that needs those ranks).

        Raises:
            RuntimeError: a send or receive failed (a peer died or the group was torn down).
        """
        self._armed = False
        for bucket in self.buckets:
            self._capture(bucket.params)
        self.control.fill_(control)
        pending: Sends = []
        try:
            if rank == root:
                pending = self._sum_and_send(root, members, idle)
            elif rank in members:
                sends = [dist.isend(flat, dst=root, tag=GRADIENT_TAG + i) for i, flat in enumerate(self.flats)]
                wait_all(sends)
                self._receive_sum(root)
            else:
                self._receive_sum(root)
        except RuntimeError:
            self.abandon()
            raise
        return float(self.control.item()), pending

    def _sum_and_send(self, root: int, members: list[int], idle: list[int]) -> Sends:
        others = sorted(m for m in members if m != root)
        incoming = [[torch.empty_like(flat) for flat in self.flats] for _ in others]
        wait_all(
            [
                dist.irecv(buffer, src=peer, tag=GRADIENT_TAG + i)
                for peer, buffers in zip(others, incoming, strict=True)
                for i, buffer in enumerate(buffers)
            ]
        )
        with torch.no_grad():
            for buffers in incoming:
                for flat, buffer in zip(self.flats, buffers, strict=True):
                    flat.add_(buffer)
        sends = [
            dist.isend(flat, dst=peer, tag=GRADIENT_TAG + i) for peer in others for i, flat in enumerate(self.flats)
        ]
        pending: Sends = []
        if idle:
            copies = [flat.clone() for flat in self.flats]  # the gradients are zeroed before the idle ranks read them
            for peer in idle:
                pending.extend(
                    (dist.isend(copy, dst=peer, tag=GRADIENT_TAG + i), copy) for i, copy in enumerate(copies)
                )
        wait_all(sends)
        return pending

    def _receive_sum(self, root: int) -> None:
        wait_all([dist.irecv(flat, src=root, tag=GRADIENT_TAG + i) for i, flat in enumerate(self.flats)])

    def abandon(self) -> None:
        """Forget every pending reduction after a failure.

        The pending works hold the failed process group; only once they are gone does the group close its
        connections, which is what makes the peers still blocked in it fail at once instead of at their timeout.
        """
        for bucket in self.buckets:
            bucket.work = None
        self._launch_error = None
        self._armed = False

    def zero(self) -> None:
        """Zero every gradient and the control word."""
        for flat in self.flats:
            flat.zero_()
        self._armed = False


def wait_all(works: list[Any]) -> None:
    """Wait for point-to-point works in order (a failed one raises ``RuntimeError``; so does a missing one)."""
    for work in works:
        if work is None:  # pragma: no cover - torch returns a work for isend/irecv
            raise RuntimeError("torch returned no work for a point-to-point operation")
        work.wait()
