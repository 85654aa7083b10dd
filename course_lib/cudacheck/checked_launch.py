"""One checked launch: its arguments in and out, its blocks run in turn, its allocations, its report."""
from __future__ import annotations

import functools
import inspect
import traceback

import numpy as np

from . import binding, fakecuda, gpumath, grid, hazards, memory, report, serial, sites, warps
from .binding import Binder
from .fakecuda import FakeCuda
from .grid import Grid
from .hazards import AccessLog
from .memory import DeviceArray, Memory, TracedArray, Uninitialized, junk
from .report import Findings, KernelError, Report
from .serial import Scheduler
from .sites import declared_name, site

# the simulator's own files: a kernel's error is told at the last line of the kernel's code, not of these
_SIMULATOR_FILES = {__file__} | {m.__file__ for m in (binding, fakecuda, gpumath, grid, hazards, memory, report,
                                                       serial, sites, warps)}


class Launch:
    """``fn[griddim, blockdim](*args)`` run in the tracing simulator: ``run()`` gives the ``Report``."""

    def __init__(self, fn, griddim, blockdim, args):
        self.fn_name = fn.__name__
        self.grid = Grid(griddim, blockdim)
        self.findings = Findings(self.grid)
        self.scheduler = Scheduler(self.grid, self.findings)
        self.log = AccessLog(self.grid, self.findings, self.scheduler)
        self.memories = []
        self.shared = {}          # the shared arrays of the block running now
        self.fake = FakeCuda(self.grid, self.scheduler, self.log, self.allocate)
        self.fn = Binder(self.fake).bind(fn)
        self.args, self.kernel_args = args, self._device_args(fn, args)

    # ---- arguments in and out

    def _device_args(self, fn, args):
        params = list(inspect.signature(fn).parameters)
        if len(params) != len(args):
            raise TypeError(f"{fn.__name__} takes {len(params)} arguments ({', '.join(params)}), "
                            f"{len(args)} were given")
        out, passed = [], {}   # passed: id of a device-side argument -> the array it became
        buffers = {}           # id of a to_device array -> its buffer: its slices are views of it
        for name, arg in zip(params, args):
            if isinstance(arg, DeviceArray):
                root = arg.root
                if id(root) in buffers:   # one device array (or slices of it) passed twice is one buffer
                    mem = buffers[id(root)].alias(name)
                else:
                    mem = buffers[id(root)] = Memory(self.log, name, "global", root._host.copy(), True)
                self.memories.append(mem)
                out.append(TracedArray(mem, arg.view_of(mem.data), name))
                continue
            if (isinstance(arg, Uninitialized) or hasattr(arg, "copy_to_host")) and id(arg) in passed:
                mem = passed[id(arg)]._mem.alias(name)   # one device array passed twice is one buffer
                self.memories.append(mem)
                out.append(TracedArray(mem, mem.data, name))
                continue
            if isinstance(arg, Uninitialized):
                data = np.full(arg.shape, junk(arg.dtype), arg.dtype)
                out.append(self._global(name, data, initialized=False))
            elif isinstance(arg, np.ndarray):
                out.append(self._global(name, np.array(arg, order="C"), initialized=True))
            elif hasattr(arg, "copy_to_host"):
                out.append(self._global(name, np.ascontiguousarray(arg.copy_to_host()), initialized=True))
            elif isinstance(arg, (int, float, complex, np.number, np.bool_)):
                out.append(arg)
            else:
                raise TypeError(f"argument {name!r}: cudacheck takes numpy arrays, device arrays, "
                                f"cudacheck.uninitialized(...) and scalars, got {type(arg).__name__}")
            if isinstance(out[-1], TracedArray):
                passed[id(arg)] = out[-1]
        return out

    def _global(self, name, data, initialized):
        mem = Memory(self.log, name, "global", data, initialized)
        self.memories.append(mem)
        return TracedArray(mem, data, name)

    def _copy_back(self):
        for arg, traced in zip(self.args, self.kernel_args):
            if isinstance(arg, Uninitialized):
                arg._host = traced._mem.data.copy()
            elif isinstance(arg, np.ndarray) and arg.flags.writeable:
                arg[...] = traced._mem.data
            elif isinstance(arg, DeviceArray):
                arg.root.copy_to_device(traced._mem.data)
            elif hasattr(arg, "copy_to_device"):
                arg.copy_to_device(traced._mem.data)

    # ---- running

    def run(self) -> Report:
        body = functools.partial(self.fn, *self.kernel_args)
        for linear in range(self.grid.nblocks):
            self.shared = {}
            self.log.new_interval()
            failed = self.scheduler.run_block(linear, body, self.log.end_interval)
            if failed is not None:
                raise self._kernel_error(failed)
        self._copy_back()
        return self._report()

    def _report(self):
        traffic = {}
        for mem in self.memories:
            for what, n in (("reads", mem.n_reads), ("writes", mem.n_writes)):
                key = f"{mem.space} {what}"
                traffic[key] = traffic.get(key, 0) + n
        by_array = {mem.name: mem.n_reads for mem in self.memories if mem.space == "global"}
        shape = self.grid
        return Report(self.fn_name, shape.griddim[:shape.gridnd], shape.blockdim[:shape.blocknd],
                      self.findings.list, self.scheduler.intervals, traffic, by_array, self.log.prefetch_intervals)

    def _kernel_error(self, t):
        frames = [f for f in traceback.extract_tb(t.error.__traceback__) if f.filename not in _SIMULATOR_FILES]
        where = f" at line {frames[-1].lineno} of {frames[-1].name} (`{(frames[-1].line or '').strip()}`)" \
            if frames else ""
        err = KernelError(f"{self.fn_name}: {self.grid.who(t)} raised {type(t.error).__name__}{where}: {t.error}")
        err.__cause__ = t.error
        return err

    # ---- allocations

    def allocate(self, space, shape, dtype, frame):
        """``cuda.shared.array`` / ``cuda.local.array`` called at ``frame`` by the running thread."""
        at = site(frame)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if space == "shared" and shape in ((), (0,)):
            raise NotImplementedError("cudacheck does not model dynamic shared memory (a shared array of "
                                      "shape 0): give the array its size, a compile-time constant")
        name = declared_name(at, f"{space} array at line {at[1]}")
        if space == "shared":  # one static array per declaration for the whole block, as in the PTX
            t = self.scheduler.thread
            n = t.declarations[at] = t.declarations.get(at, 0) + 1
            mem = self.shared.get((at, shape, dtype))
            if mem is not None:
                mem.redeclared = mem.redeclared or n > 1
                return TracedArray(mem, mem.data, name)
            mem = Memory(self.log, name, space, np.full(shape, junk(dtype), dtype), False)
            self.shared[(at, shape, dtype)] = mem
        else:
            mem = Memory(self.log, name, space, np.full(shape, junk(dtype), dtype), False)
        self.memories.append(mem)
        return TracedArray(mem, mem.data, name)
