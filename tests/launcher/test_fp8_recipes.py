"""The FP8 recipes in whole runs of the real binary (precision.fp8.recipe):
 - each block recipe trains a tiny GPT on the CPU to within 4% of BF16's final loss;
 - checkpoints record the recipe: a resume with another recipe stops with exit code 2 naming
   precision.fp8.recipe and both recipes, unless precision.fp8.allow_recipe_change=true, which
   resumes (same step) with fresh FP8 scaling state; the same recipe resumes silently; another
   precision.fp8.grad_format likewise;
 - shapes a recipe's blocks do not fit are refused before training (exit code 2).
"""

import os

import launcher_util as lu

# n_embd 128 and 8 x 64 tokens: whole 128-element blocks for BLOCKWISE.
CONFIG = """
run { steps: 12 seed: 3 device: CPU log_every: 4 }
model { gpt2 { n_layer: 1 n_head: 2 n_embd: 128 seq_len: 64 } }
data { synthetic { n_tokens: 262144 } micro_batch_size: 8 }
optimizer { adamw { lr: 0.003 weight_decay: 0 } warmup_steps: 2 }
precision { mode: FP8_HYBRID }
checkpoint { every_steps: 6 }
"""


class Fp8Recipes(lu.TempDirTest):
    def train(self, name, *sets, steps=12):
        config = self.write("fp8.pbtxt", CONFIG)
        args = ["train", "--config", config, "--progress", "lines",
                "--set", f"run.dir={os.path.join(self.dir, name)}", "--set", f"run.steps={steps}"]
        for s in sets:
            args += ["--set", s]
        return self.mantissa(*args, timeout=240)

    def losses(self, name, *sets):
        result = self.train(name, *sets)
        self.assertEqual(result.returncode, 0, result.stderr)
        log = lu.read_log(os.path.join(self.dir, name), 0)
        self.assertEqual(len(log), 12)
        return [e["loss"] for e in log]

    def test_block_recipes_train(self):
        # BF16 falls from 5.56 to 3.35 in 12 steps, and the recipes end 1.6-2.6% above it on
        # every CPU path; a recipe that lost most of the gradient's signal (as a learning rate
        # 30x lower does: 5.21) would end far above it. Each recipe rounds its own way: its
        # losses are none of BF16's, per-tensor DELAYED's or another recipe's (a recipe that
        # never reached the GEMMs would train exactly as DELAYED does).
        bf16 = self.losses("BF16", "precision.mode=BF16")
        seen = {"BF16": bf16, "DELAYED": self.losses("DELAYED", "precision.fp8.recipe=DELAYED")}
        for recipe in ("BLOCKWISE", "ROWWISE", "MXFP8"):
            losses = self.losses(recipe, f"precision.fp8.recipe={recipe}")
            self.assertLess(abs(losses[-1] - bf16[-1]), 0.04 * bf16[-1],
                            f"{recipe}: {losses[-1]} against BF16 {bf16[-1]}")
            for other, theirs in seen.items():
                self.assertNotEqual(losses[1:], theirs[1:], f"{recipe} trains as {other} does")
            seen[recipe] = losses

    def resume_needs_permission(self, name, change, refusal, note):
        """Resumes run `name` with the setting `change`: refused (exit 2, with `refusal`) until
        precision.fp8.allow_recipe_change=true, which resumes with `note`. Returns that run."""
        refused = self.train(name, change)
        self.assertEqual(refused.returncode, 2, refused.stderr)
        self.assertIn(refusal, refused.stderr)
        self.assertIn("precision.fp8.allow_recipe_change=true", refused.stderr)
        allowed = self.train(name, change, "precision.fp8.allow_recipe_change=true", steps=9)
        self.assertEqual(allowed.returncode, 0, allowed.stderr)
        self.assertIn(note, allowed.stderr)
        return allowed

    def test_resume_with_another_recipe_needs_permission(self):
        first = self.train("run", "precision.fp8.recipe=DELAYED", steps=6)
        self.assertEqual(first.returncode, 0, first.stderr)
        allowed = self.resume_needs_permission(
            "run", "precision.fp8.recipe=ROWWISE",
            "precision.fp8.recipe = ROWWISE: differs from the recipe of the checkpoint to resume "
            "(DELAYED)", "FP8 recipe ROWWISE replaces the checkpoint's DELAYED")
        self.assertIn("resumed from", allowed.stderr)
        # The checkpoint written since records ROWWISE: resuming with it needs nothing more.
        same = self.train("run", "precision.fp8.recipe=ROWWISE", steps=12)
        self.assertEqual(same.returncode, 0, same.stderr)
        self.assertNotIn("replaces", same.stderr)

    def test_resume_with_another_gradient_format_needs_permission(self):
        # The same recipe with another precision.fp8.grad_format: refused the same way (it was
        # an internal error, exit 1), and with permission the scaling state starts afresh.
        first = self.train("format", steps=6)
        self.assertEqual(first.returncode, 0, first.stderr)
        self.resume_needs_permission(
            "format", "precision.fp8.grad_format=E4M3",
            "precision.fp8.grad_format = E4M3: differs from the format of the checkpoint to "
            "resume ('h.0.attn.c_attn.grad_output' was e5m2, is e4m3)",
            "FP8 gradient format E4M3 replaces the checkpoint's")

    def test_shapes_that_break_the_blocks_are_refused(self):
        result = self.train("bad", "precision.fp8.recipe=BLOCKWISE", "model.gpt2.n_embd=96",
                            "model.gpt2.n_head=2")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("model.gpt2.n_embd = 96: must be a multiple of 128", result.stderr)


if __name__ == "__main__":
    lu.main()
