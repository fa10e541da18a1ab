"""Hydra finds launchers only in the ``hydra_plugins`` package: this is attnlab's local
launcher (``hydra/launcher=local``); the work is in ``attnlab.launcher``."""

from hydra.plugins.launcher import Launcher


class LocalLauncher(Launcher):
    def __init__(self, devices="auto", devices_per_job=1, jobs=None, lock_dir=None) -> None:
        self.options = {"devices": devices, "devices_per_job": devices_per_job, "jobs": jobs, "lock_dir": lock_dir}
        self.config = self.task_function = self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides, initial_job_idx):
        from attnlab.launcher import launch

        return launch(self, job_overrides, initial_job_idx)
