"""`python -m tests.trainer_entry ...` = trainer.train with test-only hooks, kept out of the production config.

Hooks come from the PILEPREP_TEST_HOOKS environment variable (JSON):
  dump_grads: DIR        save each rank's gradients after the first step's gradient sync (before clipping)
  dump_params: DIR       save each rank's parameters after the last step
  pid_dir: DIR           each rank writes DIR/rank<R>.pid at start (crash tests find every process by it)
  pause_after_step: N    after step N (metrics flushed, checkpoint written) every rank sleeps until killed
  wait_after_step: [N, FILE]  after step N rank 0 writes FILE.reached, then every rank waits until FILE exists
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from trainer.train import Trainer, main


class HookedTrainer(Trainer):
    hooks = json.loads(os.environ.get("PILEPREP_TEST_HOOKS", "{}"))

    def build(self):
        if self.hooks.get("pid_dir"):
            os.makedirs(self.hooks["pid_dir"], exist_ok=True)
            with open(os.path.join(self.hooks["pid_dir"], f"rank{os.environ.get('RANK', '0')}.pid"), "w") as f:
                f.write(str(os.getpid()))
        return super().build()

    def sync_grads(self):
        super().sync_grads()
        d = self.hooks.get("dump_grads")
        if d and self.step == self.start_step:
            os.makedirs(d, exist_ok=True)
            grads = {n: p.grad.detach().cpu().clone() for n, p in self.module.named_parameters() if p.grad is not None}
            torch.save(grads, os.path.join(d, f"grads-rank{self.env.rank}.pt"))

    def on_step_end(self, step):
        d = self.hooks.get("dump_params")
        if d and step == self.cfg.steps:
            os.makedirs(d, exist_ok=True)
            params = {n: p.detach().cpu().clone() for n, p in self.module.named_parameters()}
            torch.save(params, os.path.join(d, f"params-rank{self.env.rank}.pt"))
        wait = self.hooks.get("wait_after_step")
        if wait and step == wait[0]:
            if self.env.rank == 0:
                open(wait[1] + ".reached", "w").close()
            end = time.time() + 300  # never outlive a test that died before releasing us
            while not os.path.exists(wait[1]) and time.time() < end:
                time.sleep(0.1)
        if step == self.hooks.get("pause_after_step"):
            sys.stdout.flush()
            end = time.time() + 600  # wait to be killed; never outlive a test run that died before killing us
            while time.time() < end:
                time.sleep(1)
            os._exit(3)


if __name__ == "__main__":
    sys.exit(main(trainer_cls=HookedTrainer))
