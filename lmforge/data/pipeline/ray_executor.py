"""The Ray executor: the same driver as the local one, with each task a Ray task.

Ray is an optional extra (`pip install 'lmforge[ray]'`), imported only here. With an address
the tasks run on that cluster, whose nodes must see the input and output paths (a shared
filesystem); without one a local Ray instance starts with `workers` CPUs. Progress bars advance
as tasks finish rather than live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from lmforge.data.pipeline.executor import Executor
from lmforge.extras import import_extra


class RayExecutor(Executor):
    def __init__(self, workers: int = 1, address: str = "") -> None:
        super().__init__(workers)
        ray = import_extra("ray", "--executor ray", "ray")
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
            self.started = True

    def map(self, fn: Callable[[dict], dict], tasks: list[dict]) -> Iterator[dict]:
        remote = self.ray.remote(num_cpus=1, max_retries=0)(fn)
        pending = [remote.remote(task) for task in tasks]
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            yield self.ray.get(done[0])

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False
