"""`mantissa tokenize` end to end, through the real executables (one process, no mpirun):
 - a tokenizer trained on a licence text every Debian machine has, the text encoded with a
   validation split and decoded again: train + val give the text back byte for byte; the same
   for a UTF-8 text of accents, CJK, emoji, a literal U+2581, CR LF and odd spacing, cut into
   shards so small that characters outside the vocabulary (byte tokens) meet shard ends, and
   every shard decodes on its own to valid UTF-8;
 - the shards follow llm.c's format (256 int32 header: magic, version, count; size 1024 + 2 *
   count; an end-of-text token before each file) and `mantissa train` reads them (2 CPU steps);
   a tokenizer of 66,000 pieces gets Llama-3 shards (uint32, size 1024 + 4 * count) that
   decode exactly and train;
 - neither the tokens nor a trained tokenizer depend on the number of threads (1 core against
   all of them);
 - every bad input (a vocab above 2^20, an empty, missing or non-regular input, invalid UTF-8,
   an output that already holds shards or a model, or that cannot be written, which is found
   before any work) exits 2 with one line that names it, and
   leaves no file behind; --force replaces an output, stale shards included (never an input,
   nor a file named otherwise), and a replacement stopped halfway leaves a marker that
   training refuses.
(tests/launcher/test_tokenize.cpp tests the pieces, and that models which do not decode
exactly are refused.)
"""

import array
import glob
import json
import os
import random
import re
import shutil
import signal
import string
import struct
import subprocess
import time

import launcher_util as lu

LICENCE = "/usr/share/common-licenses/GPL-3"
HEADER_BYTES = 1024
# llm.c's header (magic, version) and token type: GPT-2 shards, and Llama-3 shards for
# vocabularies past 65536.
SHARD_FORMATS = {(20240520, 1): "H", (20240801, 7): "I"}
EOT = 2  # </s>

# Accents, CJK, emoji, a literal U+2581 (SentencePiece's own space symbol), CR LF, tabs,
# leading, doubled and trailing spaces, and no newline at the end.
UTF8_LINES = [
    "  Déjà vu: l'été à Montréal, crème brûlée et cœur — «ça va?»",
    "中文字符：机器学习与自然语言处理。日本語のテキストも少し。",
    "Emoji 😀🚀🦀 and flags 🇫🇷; math ∑∫√∞ ≠ ≤; the block ▁ itself ▁▁ twice.",
    "Ελληνικά και Кириллица, עברית, العربية\tafter a tab  ",
    "Zürich, Kraków, Ærøskøbing, İstanbul, Đà Nẵng\r",
]


def utf8_text(lines=400):
    return "\n".join(f"{i:03d} {UTF8_LINES[i % len(UTF8_LINES)]}" for i in range(lines)) + " end"


def handles(pid, signum, mask="SigCgt:"):
    """Whether process `pid` has a handler for signal `signum` (its SigCgt mask in /proc; or
    ignores it, with mask "SigIgn:")."""
    with open(f"/proc/{pid}/status") as f:
        bits = next(int(line.split()[1], 16) for line in f if line.startswith(mask))
    return bool(bits & (1 << (signum - 1)))


def directory_contents(path):
    """{name: bytes} of every file in directory `path`."""
    found = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            found[name] = f.read()
    return found


def read_shard(path):
    """The tokens of an llm.c shard, after checking its header and size."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    assert (magic, version) in SHARD_FORMATS, f"{path}: header {magic} {version}"
    tokens = array.array(SHARD_FORMATS[(magic, version)])
    assert len(data) == HEADER_BYTES + tokens.itemsize * count, \
        f"{path}: {len(data)} bytes for {count} tokens"
    tokens.frombytes(data[HEADER_BYTES:])
    assert len(tokens) == count
    return list(tokens)


class Tokenize(lu.TempDirTest):
    def tokenize(self, *args, **kwargs):
        return self.mantissa("tokenize", *args, **kwargs)

    def ok(self, *args):
        result = self.tokenize(*args)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def train_tokenizer(self, inputs, vocab=1000, out="tok.model", *extra):
        self.ok("train", "--input", *inputs, "--vocab-size", str(vocab), "--out",
                os.path.join(self.dir, out), *extra)
        return os.path.join(self.dir, out)

    def encode(self, tokenizer, inputs, out="shards", *extra):
        out_dir = os.path.join(self.dir, out)
        self.ok("encode", "--tokenizer", tokenizer, "--input", *inputs, "--out-dir", out_dir,
                *extra)
        return out_dir

    def decode(self, tokenizer, shards):
        result = subprocess.run([lu.binary(), "tokenize", "decode", "--tokenizer", tokenizer,
                                 "--input", *shards], capture_output=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout

    def shards(self, out_dir, split):
        paths = sorted(glob.glob(os.path.join(out_dir, f"{split}_*.bin")))
        names = [os.path.basename(p) for p in paths]
        self.assertEqual(names, [f"{split}_{i:06d}.bin" for i in range(len(paths))])
        return paths

    def assert_round_trip(self, tokenizer, out_dir, text_bytes, documents):
        train, val = self.shards(out_dir, "train"), self.shards(out_dir, "val")
        self.assertTrue(train and val, os.listdir(out_dir))
        tokens = {p: read_shard(p) for p in train + val}
        stream = [t for p in train + val for t in tokens[p]]
        self.assertEqual(stream[0], EOT, "each document starts with the end-of-text token")
        self.assertEqual(stream.count(EOT), documents)
        val_tokens = sum(len(tokens[p]) for p in val)
        self.assertAlmostEqual(val_tokens / len(stream), 0.1, delta=0.01)
        # Train then val is the input; so are the splits decoded apart, concatenated.
        self.assertEqual(self.decode(tokenizer, train + val), text_bytes)
        self.assertEqual(self.decode(tokenizer, train) + self.decode(tokenizer, val), text_bytes)
        with open(tokenizer, "rb") as a, open(os.path.join(out_dir, "tokenizer.model"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.assertEqual([n for n in os.listdir(out_dir) if n.endswith(".tmp")], [])
        return stream

    def test_licence_round_trip_and_training_on_the_shards(self):
        tokenizer = self.train_tokenizer([LICENCE], 1000)
        out_dir = self.encode(tokenizer, [LICENCE], "shards", "--val-fraction", "0.1",
                              "--shard-tokens", "4000")
        with open(LICENCE, "rb") as f:
            text = f.read()
        stream = self.assert_round_trip(tokenizer, out_dir, text, documents=1)
        self.assertGreater(len(self.shards(out_dir, "train")), 1)
        self.assertLess(max(stream), 1000)
        self.assertLess(len(stream), len(text) / 2.5, "a 1000-piece BPE compresses English text")

        # The reader training uses takes them: two CPU steps of a tiny GPT, vocab above 1000.
        config = self.write("own.pbtxt", f"""
run {{ steps: 2 seed: 1 device: CPU log_every: 1 dir: "{self.dir}/run" }}
model {{ gpt2 {{ n_layer: 1 n_head: 2 n_embd: 32 seq_len: 32 vocab_size: 1024 }} }}
data {{ token_shards {{ pattern: "{out_dir}/train_*.bin" }} micro_batch_size: 2 }}
precision {{ mode: FP32 }}
""")
        result = self.mantissa("train", "--config", config, "--progress", "lines")
        self.assertEqual(result.returncode, 0, result.stderr)
        log = lu.read_log(os.path.join(self.dir, "run"), 0)
        self.assertEqual([e["step"] for e in log], [0, 1])
        # A model smaller than the shards' tokenizer stops at start, not at the first token
        # past its vocabulary.
        result = self.mantissa("train", "--config", config, "--set",
                               f"run.dir={self.dir}/small", "--set", "model.gpt2.vocab_size=512")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(f"mantissa: model.gpt2.vocab_size = 512: is smaller than the 1000 pieces of "
                      f"the tokenizer {out_dir}/tokenizer.model (the shards' tokenizer)",
                      result.stderr)
        # The same from shards in a directory whose name the pattern escapes for glob ('[', '*')
        # and that starts with '--', as the tokenizer's relative path then does.
        shutil.copytree(out_dir, os.path.join(self.dir, "--shards [v2] *"))
        result = self.mantissa("train", "--config", config, "--set", f"run.dir={self.dir}/odd",
                               "--set", "model.gpt2.vocab_size=512", "--set",
                               'data.token_shards={pattern: "--shards \\\\[v2] \\\\*/train_*.bin"}')
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("mantissa: model.gpt2.vocab_size = 512: is smaller than the 1000 pieces of "
                      "the tokenizer --shards [v2] */tokenizer.model (the shards' tokenizer)",
                      result.stderr)
        # On 2 ranks rank 0 alone asks the tokenizer, and its refusal ends both, said once: rank 1
        # does not go on to find a validation token past the vocabulary. A copy of the binary
        # finds, beside it, a mantissa-tokenize that logs each start and runs the real one.
        bin_dir = os.path.join(self.dir, "bin")
        os.makedirs(bin_dir)
        copy = shutil.copy2(lu.binary(), os.path.join(bin_dir, "mantissa"))
        starts = os.path.join(self.dir, "tokenize_starts")
        stand_in = os.path.join(bin_dir, "mantissa-tokenize")
        real = os.path.join(os.path.dirname(lu.binary()), "mantissa-tokenize")
        with open(stand_in, "w") as f:
            f.write(f'#!/bin/sh\necho "$$ $1" >>"{starts}"\nexec "{real}" "$@"\n')
        os.chmod(stand_in, 0o755)
        result = subprocess.run(
            lu.mpirun_prefix(2) + [copy, "train", "--config", config, "--set",
                                   f"run.dir={self.dir}/small2", "--set",
                                   "model.gpt2.vocab_size=512", "--set",
                                   f"data.token_shards.val_pattern={out_dir}/val_*.bin",
                                   "--set", "run.eval_every=1"],
            cwd=self.dir, env=lu.environment(), timeout=120, capture_output=True, text=True)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr.count("is smaller than the 1000 pieces of the tokenizer"),
                         1, result.stderr)
        self.assertNotIn(">= vocab_size", result.stderr)
        with open(starts) as f:
            self.assertEqual(len(f.readlines()), 1, "one mantissa-tokenize for 2 ranks")

        # A Hugging Face export carries the tokenizer beside the shards; without one it warns.
        hf = os.path.join(self.dir, "hf")
        result = self.mantissa("export", "--config", config, "--format", "hf", "--out", hf)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("warning", result.stderr)
        with open(tokenizer, "rb") as a, open(os.path.join(hf, "tokenizer.model"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        # info, as its help says: ids 0 <unk>, 1 <s> and 2 </s> in every model tokenize trains.
        info = self.mantissa("tokenize", "info", "--tokenizer", tokenizer)
        self.assertEqual(info.returncode, 0, info.stderr)
        self.assertEqual(info.stdout.splitlines(), ["vocab_size 1000", "eot 2", "never_encoded 0 1"])
        # config.json names the end of text (id 2, </s>, in every model tokenize trains) for
        # transformers' generate(); the export without a tokenizer leaves transformers' defaults.
        with open(os.path.join(hf, "config.json")) as f:
            hf_config = json.load(f)
        self.assertEqual((hf_config["bos_token_id"], hf_config["eos_token_id"]), (2, 2))
        os.remove(os.path.join(out_dir, "tokenizer.model"))
        bare = os.path.join(self.dir, "hf_bare")
        result = self.mantissa("export", "--config", config, "--format", "hf", "--out", bare)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("mantissa: warning: no tokenizer for this run", result.stderr)
        self.assertEqual(sorted(os.listdir(bare)), ["config.json", "model.safetensors"])
        with open(os.path.join(bare, "config.json")) as f:
            self.assertNotIn("eos_token_id", json.load(f))
        # From another directory the config's relative paths name nothing: a tokenizer the
        # config names is refused, a shards directory not there is warned of, and both say
        # where to run the export.
        elsewhere = os.path.join(self.dir, "elsewhere")
        os.makedirs(elsewhere)
        shutil.copy2(tokenizer, os.path.join(self.dir, "tok_copy.model"))
        relative = os.path.relpath(out_dir, self.dir)
        hint = ("(a path relative to the directory mantissa train ran in: run mantissa export "
                "from there)")
        for setting, code, said in (
                ("data.tokenizer=tok_copy.model", 2,
                 f'mantissa: data.tokenizer = "tok_copy.model": no such file, named by the '
                 f"run's config {hint}"),
                (f"data.token_shards.pattern={relative}/train_*.bin", 0,
                 f"mantissa: warning: no tokenizer for this run (data.tokenizer is empty and the "
                 f"shards' directory {relative} is not there {hint}): hf_elsewhere gets none")):
            result = subprocess.run([lu.binary(), "export", "--config", config, "--set", setting,
                                     "--format", "hf", "--out", "hf_elsewhere"], cwd=elsewhere,
                                    env=lu.environment(), timeout=120, capture_output=True,
                                    text=True)
            self.assertEqual(result.returncode, code, result.stderr)
            self.assertIn(said, result.stderr)
        self.assertEqual(sorted(os.listdir(os.path.join(elsewhere, "hf_elsewhere"))),
                         ["config.json", "model.safetensors"])

    def test_utf8_round_trip_with_byte_tokens_at_shard_ends(self):
        def write(name, text):
            path = os.path.join(self.dir, name)
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            return path

        # A unigram model of few pieces, trained on the text; then two documents: part of that
        # text, and characters it never saw, which become byte tokens (up to 4 per character).
        tokenizer = self.train_tokenizer([write("train.txt", utf8_text())], 400, "tok.model",
                                         "--model-type", "unigram")
        seen = write("seen.txt", utf8_text(60))
        unseen = write("unseen.txt", "".join(f"{i} unseen: 🦀🐍🦊 龍鳳麒麟 ✓✗ ∮ ⌘ ñandú\n"
                                             for i in range(20)))
        # Shards so short that their ends keep meeting characters' byte tokens.
        out_dir = self.encode(tokenizer, [seen, unseen], "shards", "--shard-tokens", "5")
        expected = (utf8_text(60) + "".join(f"{i} unseen: 🦀🐍🦊 龍鳳麒麟 ✓✗ ∮ ⌘ ñandú\n"
                                            for i in range(20))).encode("utf-8")
        stream = self.assert_round_trip(tokenizer, out_dir, expected, documents=2)
        continuation = range(3 + 0x80, 3 + 0xC0)
        byte_tokens = [t for t in stream if 3 <= t < 3 + 256]
        self.assertGreater(len(byte_tokens), 300, "characters outside the vocabulary")
        # U+2581 itself is encoded as its bytes E2 96 81.
        self.assertIn([3 + 0xE2, 3 + 0x96, 3 + 0x81],
                      [stream[i:i + 3] for i in range(len(stream) - 2)])
        # No shard starts inside a character; shards that start with a character's bytes, or
        # end early before one, decode on their own to valid UTF-8.
        shards = self.shards(out_dir, "train") + self.shards(out_dir, "val")
        lengths = [len(read_shard(p)) for p in shards]
        self.assertLessEqual(max(lengths), 5)
        self.assertLess(min(lengths[:-1]), 5, "a shard ended early before a character's bytes")
        starting_with_bytes = [p for p in shards if 3 <= read_shard(p)[0] < 3 + 256]
        for path in shards:
            self.assertNotIn(read_shard(path)[0], continuation, path)
        self.assertGreater(len(starting_with_bytes), 20)
        for path in starting_with_bytes[:20]:
            self.decode(tokenizer, [path]).decode("utf-8")

    def test_text_with_few_spaces_round_trips(self):
        # Chinese text without spaces: the space symbol is not learned from it, yet is a piece,
        # so a space in later text decodes to a space (before, training refused its own model).
        # Also the smallest vocabulary over a text of one letter.
        chars = "机器学习与自然语言处理中文字符的训练数据集模型"
        lines = ["".join(chars[(i * 7 + j * 3) % len(chars)] for j in range(60))
                 for i in range(300)]
        no_spaces = self.write("zh.txt", "\n".join(lines) + "\n")
        with_spaces = self.write("mixed.txt", "中文 and English, 机器 学习  twice\n")
        expected = ("\n".join(lines) + "\n中文 and English, 机器 学习  twice\n").encode("utf-8")
        for model_type in ("bpe", "unigram"):
            with self.subTest(model_type):
                tokenizer = self.train_tokenizer([no_spaces], 300, model_type + ".model",
                                                 "--model-type", model_type)
                out_dir = self.encode(tokenizer, [no_spaces, with_spaces], model_type)
                self.assert_round_trip(tokenizer, out_dir, expected, documents=2)
        self.train_tokenizer([self.write("a.txt", "aaaa\n")], 262, "a.model")

    def test_a_vocabulary_past_65536_writes_llama3_shards(self):
        # Random words give a unigram model enough to learn 66,000 pieces. Its ids pass uint16,
        # so encode writes llm.c's Llama-3 shards (uint32 tokens), which decode and train.
        rng = random.Random(1)
        words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randrange(5, 9)))
                 for _ in range(100000)]
        text = "".join(" ".join(rng.choice(words) for _ in range(12)) + "\n"
                       for _ in range(20000))
        path = self.write("words.txt", text)
        tokenizer = self.train_tokenizer([path], 66000, "tok.model", "--model-type", "unigram")
        out_dir = self.encode(tokenizer, [path], "shards", "--shard-tokens", "100000")
        for shard in self.shards(out_dir, "train") + self.shards(out_dir, "val"):
            with open(shard, "rb") as f:
                self.assertEqual(struct.unpack("<2i", f.read(8)), (20240801, 7), shard)
        stream = self.assert_round_trip(tokenizer, out_dir, text.encode(), documents=1)
        self.assertGreater(max(stream), 65535)

        config = self.write("wide.pbtxt", f"""
run {{ steps: 2 seed: 1 device: CPU log_every: 1 dir: "{self.dir}/run" }}
model {{ mlp {{ n_embd: 32 hidden: 64 seq_len: 32 vocab_size: 66000 }} }}
data {{ token_shards {{ pattern: "{out_dir}/train_*.bin" }} micro_batch_size: 2 }}
""")
        result = self.mantissa("train", "--config", config, "--progress", "lines")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual([e["step"] for e in lu.read_log(os.path.join(self.dir, "run"), 0)],
                         [0, 1])

    def test_tokens_do_not_depend_on_the_thread_count(self):
        # Over 2 MiB, so that the text is encoded in several chunks at once.
        with open(LICENCE) as f:
            licence = f.read()
        big = self.write("big.txt", "".join(f"{i} {licence}" for i in range(70)))
        tokenizer = self.train_tokenizer([LICENCE], 600)

        def encode_on(cores, out):
            out_dir = os.path.join(self.dir, out)
            result = subprocess.run(
                [lu.binary(), "tokenize", "encode", "--tokenizer", tokenizer, "--input", big,
                 "--out-dir", out_dir, "--shard-tokens", "300000"],
                preexec_fn=lambda: os.sched_setaffinity(0, cores), capture_output=True,
                text=True, timeout=240)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn(f" on {len(cores)} thread{'' if len(cores) == 1 else 's'};",
                          result.stderr)
            files = sorted(os.listdir(out_dir))
            contents = {}
            for name in files:
                with open(os.path.join(out_dir, name), "rb") as f:
                    contents[name] = f.read()
            return contents

        every = os.sched_getaffinity(0)
        if len(every) < 2:
            self.skipTest("one CPU: no other thread count to encode with")
        one = encode_on({min(every)}, "one")
        self.assertEqual(encode_on(every, "all"), one)
        self.assertGreater(len(one), 3)

    def test_ids_are_the_tokens_encode_writes(self):
        # Text of several 1 MiB chunks, each of many 4 KiB pieces: `ids` encodes it as encode
        # does (and so in a piece's memory, not the whole text's), only without the document's
        # leading end-of-text token.
        with open(LICENCE) as f:
            licence = f.read()
        text = "".join(f"{i} {licence}" for i in range(70))
        self.assertGreater(len(text), 2 << 20)
        tokenizer = self.train_tokenizer([LICENCE], 600)
        out_dir = self.encode(tokenizer, [self.write("big.txt", text)], "shards",
                              "--val-fraction", "0")
        written = [t for shard in self.shards(out_dir, "train") for t in read_shard(shard)]
        result = subprocess.run([lu.binary(), "tokenize", "ids", "--tokenizer", tokenizer],
                                input=text, capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual([int(t) for t in result.stdout.split()], written[1:])

    def shards_of_two_tokenizers(self, checkpoint=""):
        """Two tokenizers of the licence, shards encoded by the first, and a run's config on
        them (`checkpoint`: that section's fields): (first, second, shards' directory, config)."""
        first = self.train_tokenizer([LICENCE], 600, "first.model")
        second = self.train_tokenizer([LICENCE], 700, "second.model")
        out_dir = self.encode(first, [LICENCE], "shards")
        config = self.write("run.pbtxt", f"""
run {{ steps: 1 seed: 1 device: CPU dir: "{self.dir}/run" }}
model {{ gpt2 {{ n_layer: 1 n_head: 2 n_embd: 32 seq_len: 32 vocab_size: 1024 }} }}
data {{ token_shards {{ pattern: "{out_dir}/train_*.bin" }} micro_batch_size: 2 }}
precision {{ mode: FP32 }}
checkpoint {{ {checkpoint} }}
""")
        return first, second, out_dir, config

    def test_a_resume_on_another_tokenizers_shards_is_refused_unless_allowed(self):
        # The checkpoint records the tokenizer; re-encoded by the same one, the shards resume
        # quietly; by another, the ids mean other text: refused, on 2 ranks too with one
        # message, unless data.allow_tokenizer_change, which warns.
        first, second, out_dir, config = self.shards_of_two_tokenizers()

        def resume(steps, *sets, code=0, ranks=0):
            args = [a for s in sets for a in ("--set", s)]
            result = self.mantissa("train", "--config", config, "--set", f"run.steps={steps}",
                                   *args, ranks=ranks)
            self.assertEqual(result.returncode, code, result.stderr)
            return result.stderr

        resume(1)
        self.encode(first, [LICENCE], "shards", "--force")
        self.assertNotIn("warning", resume(2))
        self.encode(second, [LICENCE], "shards", "--force")
        refusal = (f'mantissa: data.token_shards.pattern = "{out_dir}/train_*.bin": its tokenizer '
                   f"{out_dir}/tokenizer.model is another than the one the checkpoint was "
                   "trained with, so the same token ids would stand for other text; set "
                   "data.allow_tokenizer_change=true to train on with it\n")
        self.assertEqual(resume(3, code=2), refusal)
        self.assertEqual(resume(3, code=2, ranks=2).count("mantissa: "), 1)
        self.assertIn(refusal, resume(3, code=2, ranks=2))
        self.assertIn(f"mantissa: warning: the checkpoint was trained with another tokenizer than "
                      f"{out_dir}/tokenizer.model: the same token ids stand for other text from "
                      "here on (data.allow_tokenizer_change)\n",
                      resume(3, "data.allow_tokenizer_change=true"))
        # Without its tokenizer.model the shards' ids cannot be checked: refused too, or the
        # next checkpoint would record no tokenizer and no later resume could tell.
        os.rename(f"{out_dir}/tokenizer.model", f"{out_dir}/tokenizer.model.moved")
        self.assertEqual(resume(4, code=2),
                         f'mantissa: data.token_shards.pattern = "{out_dir}/train_*.bin": no '
                         "tokenizer.model beside the shards, but the checkpoint was trained with "
                         "one, so nothing shows that the token ids still stand for the same text; "
                         "put it back, or set data.allow_tokenizer_change=true to train on "
                         "without it\n")
        # Other data has no tokenizer at all: its ids are not the checkpoint's.
        self.assertEqual(resume(4, "data.synthetic={}", code=2),
                         "mantissa: data: synthetic tokens have no tokenizer, but the checkpoint "
                         "was trained with one, so its token ids stand for other text; set "
                         "data.allow_tokenizer_change=true to train on with them\n")

    def test_a_data_tokenizer_other_than_the_shards_own_is_refused_unless_allowed(self):
        # The tokenizer.model beside the shards encoded them; data.tokenizer names another: sample
        # and export would read the ids as other text. Refused (one message on 2 ranks), unless
        # data.allow_tokenizer_change, which warns; a copy of the shards' own is the same.
        first, second, out_dir, config = self.shards_of_two_tokenizers("resume: NEVER")

        def train(tokenizer, *sets, code=0, ranks=0):
            args = [a for s in sets for a in ("--set", s)]
            shutil.rmtree(os.path.join(self.dir, "run"), ignore_errors=True)
            result = self.mantissa("train", "--config", config, "--set",
                                   f"data.tokenizer={tokenizer}", *args, ranks=ranks)
            self.assertEqual(result.returncode, code, result.stderr)
            return result.stderr

        differs = (f'data.tokenizer = "{second}" is another than the tokenizer that encoded the '
                   f"shards, {out_dir}/tokenizer.model")
        refusal = (f"mantissa: {differs}, so the token ids would stand for other text; leave "
                   "data.tokenizer empty, or set data.allow_tokenizer_change=true to train with "
                   "it (a run that has trained with it resumes only so)\n")
        self.assertEqual(train(second, code=2), refusal)
        both = train(second, code=2, ranks=2)
        self.assertEqual(both.count("mantissa: "), 1, both)
        self.assertIn(refusal, both)
        self.assertIn(f"mantissa: warning: {differs}: sample and export read the token ids with "
                      "data.tokenizer (data.allow_tokenizer_change)\n",
                      train(second, "data.allow_tokenizer_change=true"))
        copy = os.path.join(self.dir, "first_copy.model")
        shutil.copy2(first, copy)
        self.assertNotIn("warning", train(copy))

    def test_a_ctrl_c_while_the_start_reads_the_tokenizer_stops_as_any_start_does(self):
        # A Ctrl-C at a terminal (or a job's SIGTERM to its process group) also reaches the
        # mantissa-tokenize that the start runs to read the shards' tokenizer. The run stops as a
        # stop during the start does (exit 130), not as a failed tokenizer (exit 1). The
        # mantissa-tokenize beside a copy of mantissa waits the first time, for the Ctrl-C.
        tokenizer = self.train_tokenizer([LICENCE], 600)
        out_dir = self.encode(tokenizer, [LICENCE], "shards")
        bin_dir = os.path.join(self.dir, "bin")
        os.mkdir(bin_dir)
        shutil.copy2(lu.binary(), bin_dir)
        real = os.path.join(os.path.dirname(lu.binary()), "mantissa-tokenize")
        waiting = os.path.join(self.dir, "waiting")
        script = os.path.join(bin_dir, "mantissa-tokenize")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\nif [ ! -e {waiting} ]; then touch {waiting}; sleep 60; fi\n"
                    f'exec {real} "$@"\n')
        os.chmod(script, 0o755)
        config = self.write("run.pbtxt", f"""
run {{ steps: 1 seed: 1 device: CPU dir: "{self.dir}/run" }}
model {{ gpt2 {{ n_layer: 1 n_head: 2 n_embd: 32 seq_len: 32 vocab_size: 1024 }} }}
data {{ token_shards {{ pattern: "{out_dir}/train_*.bin" }} micro_batch_size: 2 }}
precision {{ mode: FP32 }}
""")
        process = subprocess.Popen(
            [os.path.join(bin_dir, "mantissa"), "train", "--config", config], cwd=self.dir,
            env=lu.environment(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(waiting):
                if process.poll() is not None:
                    self.fail(f"mantissa ended first: {process.communicate()}")
                self.assertLess(time.monotonic(), deadline, "mantissa-tokenize never ran")
                time.sleep(0.01)
            os.killpg(process.pid, signal.SIGINT)
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        self.assertEqual(process.returncode, 130, stderr)
        self.assertIn("mantissa: interrupted (SIGINT) during the start: stopped before step 1/1; "
                      "no checkpoint yet", stderr)
        self.assertNotIn("failed", stderr)

    def test_an_input_list_stands_for_its_files_where_it_is_given(self):
        tokenizer = self.train_tokenizer([LICENCE], 600)
        first = self.write("first.txt", "the first file\n")
        second = self.write("second.txt", "the second file, with spaces in its name\n")
        spaced = self.write("with space.txt", "and a third\n")
        # Empty lines and comments are skipped; a file whose name begins with # is given as ./#x.
        hashed = self.write("#hashed.txt", "and a fourth\n")
        listing = self.write("list.txt", f"# the corpus\n{second}\n\n{spaced}\r\n"
                                         f"#{hashed}\n{os.path.join(self.dir, '.', '#hashed.txt')}\n")

        given = self.encode(tokenizer, [first, second, spaced, hashed], "given",
                            "--val-fraction", "0")
        listed = self.encode(tokenizer, [first], "listed", "--input-list", listing,
                             "--val-fraction", "0")
        self.assertEqual(directory_contents(listed), directory_contents(given))
        shard_list = self.write("shards.txt", "\n".join(self.shards(listed, "train")))
        result = subprocess.run([lu.binary(), "tokenize", "decode", "--tokenizer", tokenizer,
                                 "--input-list", shard_list], capture_output=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, b"the first file\nthe second file, with spaces in its "
                                        b"name\nand a third\nand a fourth\n")
        # The list may be a pipe, as a shell's process substitution makes it.
        piped = subprocess.run(["bash", "-c", 'exec "$0" tokenize decode --tokenizer "$1" '
                                              '--input-list <(cat "$2")',
                                lu.binary(), tokenizer, shard_list],
                               capture_output=True, timeout=120)
        self.assertEqual(piped.returncode, 0, piped.stderr)
        self.assertEqual(piped.stdout, result.stdout)

    def test_training_does_not_depend_on_the_thread_count(self):
        # Unigram training sums expected counts per thread; the model records the count.
        every = os.sched_getaffinity(0)
        if len(every) < 2:
            self.skipTest("one CPU: no other thread count to train with")
        for model_type in ("unigram", "bpe"):
            models = []
            for cores in ({min(every)}, every):
                out = os.path.join(self.dir, f"{model_type}{len(cores)}.model")
                result = subprocess.run(
                    [lu.binary(), "tokenize", "train", "--input", LICENCE, "--vocab-size", "600",
                     "--model-type", model_type, "--out", out],
                    preexec_fn=lambda: os.sched_setaffinity(0, cores), capture_output=True,
                    text=True, timeout=240)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn(f" on {len(cores)} core{'' if len(cores) == 1 else 's'}\n",
                              result.stderr)
                with open(out, "rb") as f:
                    models.append(f.read())
            self.assertEqual(models[0], models[1], model_type)

    def test_training_samples_text_past_sample_bytes_evenly(self):
        # 1.2 MB of licence, then 1.2 MB of a word the licence never has. A sample of 200 kB
        # taken from the start would never see that word; one spread evenly learns it.
        with open(LICENCE) as f:
            licence = f.read()
        first = self.write("licence.txt", licence * 35)
        second = self.write("word.txt", "zyxwvutsrq and more zyxwvutsrq\n" * 38000)

        def train(out):
            result = self.ok("train", "--input", first, second, "--vocab-size", "600",
                             "--sample-bytes", "200000", "--out", os.path.join(self.dir, out))
            match = re.search(r"trained on ([\d.]+) kB sampled evenly from 2\.4 MB of text",
                              result.stderr)
            self.assertIsNotNone(match, result.stderr)
            self.assertAlmostEqual(float(match.group(1)), 200, delta=20)
            with open(os.path.join(self.dir, out), "rb") as f:
                return f.read()

        self.assertEqual(train("a.model"), train("b.model"), "the same blocks on every run")
        result = subprocess.run([lu.binary(), "tokenize", "ids", "--tokenizer",
                                 os.path.join(self.dir, "a.model")], input="zyxwvutsrq",
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertLessEqual(len(result.stdout.split()), 2, result.stdout)

    def test_force_replaces_an_output_and_its_stale_shards(self):
        tokenizer = self.train_tokenizer([LICENCE], 600)
        out_dir = self.encode(tokenizer, [LICENCE], "shards", "--shard-tokens", "2000")
        self.assertGreater(len(self.shards(out_dir, "train")), 2)
        # What an encode killed before its commit leaves (hidden staged names) goes too; a
        # user's own files stay, also those named like outputs with .tmp after them.
        users = ("notes.tmp", "tokenizer.model.tmp", "val_notes.bin.tmp")
        for name in (".train_000007.bin.tmp", ".tokenizer.model.tmp") + users:
            with open(os.path.join(out_dir, name), "wb") as f:
                f.write(b"x")
        self.encode(tokenizer, [LICENCE], "shards", "--force")
        self.assertEqual(sorted(os.listdir(out_dir)),
                         sorted(["tokenizer.model", "train_000000.bin", "val_000000.bin", *users]))
        for name in users:
            os.remove(os.path.join(out_dir, name))
        self.train_tokenizer([LICENCE], 700, "tok.model", "--force")
        self.encode(tokenizer, [LICENCE], "none", "--val-fraction", "0")
        self.assertEqual(sorted(os.listdir(os.path.join(self.dir, "none"))),
                         ["tokenizer.model", "train_000000.bin"])

    def test_a_replacement_that_stops_halfway_is_refused_by_training(self):
        # The shards of a set cannot all change in one step. Here the rename of the second
        # shard fails (a directory is in its place), as a crash could stop it: the directory
        # holds a mix of the two sets, which would train without complaint, so the encode
        # leaves its marker and training refuses the directory until an encode finishes there.
        tokenizer = self.train_tokenizer([LICENCE], 600)
        out_dir = self.encode(tokenizer, [LICENCE], "shards", "--shard-tokens", "2000")
        obstacle = os.path.join(out_dir, "train_000001.bin")
        os.remove(obstacle)
        os.makedirs(os.path.join(obstacle, "in_the_way"))
        result = self.tokenize("encode", "--tokenizer", tokenizer, "--input", LICENCE,
                               "--out-dir", out_dir, "--shard-tokens", "2000", "--force")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"'{out_dir}' now holds an unfinished set of shards, which training "
                      "refuses: encode again with --force", result.stderr)
        marker = os.path.join(out_dir, ".mantissa-encode-unfinished")
        self.assertTrue(os.path.exists(marker))
        result = self.tokenize("encode", "--tokenizer", tokenizer, "--input", LICENCE,
                               "--out-dir", out_dir, "--shard-tokens", "2000")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("already holds token shards (tokenizer.model, ...), from an encode that "
                      "did not finish; --force replaces them", result.stderr)
        shutil.rmtree(obstacle)  # what a crash would leave: a mix of shards, no obstacle
        config = self.write("own.pbtxt", f"""
run {{ steps: 2 seed: 1 device: CPU dir: "{self.dir}/run" }}
model {{ gpt2 {{ n_layer: 1 n_head: 2 n_embd: 32 seq_len: 32 vocab_size: 1024 }} }}
data {{ token_shards {{ pattern: "{out_dir}/train_*.bin" }} micro_batch_size: 2 }}
""")
        result = self.mantissa("train", "--config", config)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(f"is in a directory whose encoding did not finish ({marker} is there",
                      result.stderr)
        self.encode(tokenizer, [LICENCE], "shards", "--shard-tokens", "2000", "--force")
        self.assertFalse(os.path.exists(marker))
        result = self.mantissa("train", "--config", config)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_an_interrupted_encode_leaves_the_output_as_it_was(self):
        # Ctrl-C (or SIGTERM) during an encode, which may run for hours: the command removes
        # what it made and ends by the signal (so that a shell loop stops too). 32 MB of text
        # takes seconds to encode, and the signal comes once the handlers are in (the process's
        # caught-signal mask says so).
        tokenizer = self.train_tokenizer([LICENCE], 600)
        with open(LICENCE) as f:
            licence = f.read()
        big = self.write("big.txt", licence * (32 * 2**20 // len(licence)))

        def wait_for_handler(process, signum):
            deadline = time.time() + 60
            while not handles(process.pid, signum):
                self.assertIsNone(process.poll(), "the encode ended before it was interrupted")
                self.assertLess(time.time(), deadline, "no handler for the signal in 60 s")
                time.sleep(0.01)

        def interrupt(out_dir, signum, *extra):
            process = self.start("tokenize", "encode", "--tokenizer", tokenizer, "--input", big,
                                 "--out-dir", out_dir, *extra)
            wait_for_handler(process, signum)
            process.send_signal(signum)
            _, stderr = process.communicate(timeout=120)
            self.assertEqual(process.returncode, -signum, stderr)
            self.assertIn(f"mantissa: interrupted by {signal.Signals(signum).name}: nothing "
                          "written, the output left as it was", stderr)

        # A new directory (and its parents) goes again.
        interrupt(os.path.join(self.dir, "new", "shards"), signal.SIGINT)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "new")))
        # A set being replaced stays as it was, byte for byte.
        out_dir = self.encode(tokenizer, [LICENCE], "shards")
        before = directory_contents(out_dir)
        interrupt(out_dir, signal.SIGTERM, "--force")
        self.assertEqual(directory_contents(out_dir), before)
        # A SIGHUP the process was started to ignore (nohup) stays ignored.
        process = subprocess.Popen(
            ["bash", "-c", 'trap "" HUP; exec "$@"', "bash", lu.binary(), "tokenize", "encode",
             "--tokenizer", tokenizer, "--input", big, "--out-dir",
             os.path.join(self.dir, "nohup")], stderr=subprocess.PIPE, text=True)
        wait_for_handler(process, signal.SIGINT)
        self.assertFalse(handles(process.pid, signal.SIGHUP))
        self.assertTrue(handles(process.pid, signal.SIGHUP, "SigIgn:"))
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)
        self.assertEqual(process.returncode, -signal.SIGINT)

    def test_help(self):
        for args in (("tokenize", "--help"), ("help", "tokenize"), ("tokenize", "encode", "-h")):
            result = self.mantissa(*args)
            self.assertEqual(result.returncode, 0, result.stderr)
            text = result.stdout
            for option in ("--input FILE...", "--vocab-size N", "--model-type", "--sample-bytes N",
                           "--tokenizer",
                           "--out-dir DIR", "--val-fraction F", "--shard-tokens N", "--force",
                           "train_NNNNNN.bin", "val_NNNNNN.bin", "tokenizer.model",
                           "default 0.1", "20240520", "20240801", "end-of-text",
                           "260..1048576"):
                self.assertIn(option, text)
            codes = re.findall(r"^  (\d)  ", text.split("exit codes:", 1)[1], re.MULTILINE)
            self.assertEqual(codes, ["0", "1", "2"])
        self.assertIn("tokenize", self.mantissa("--help").stdout)


class BadInput(lu.TempDirTest):
    """Each case: exit 2, one line on stderr, and no file added to the test's directory."""

    def assert_refused(self, expected, *args):
        """Runs `mantissa tokenize ARGS`; expects exit 2 and one stderr line equal to `expected`
        (a str) or matching it (a compiled regex). "{dir}" in either stands for the test's
        directory."""
        before = self.listing()
        result = self.mantissa("tokenize", *(a.replace("{dir}", self.dir) for a in args))
        lines = result.stderr.splitlines()
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(len(lines), 1, f"expected one line on stderr, got:\n{result.stderr}")
        if isinstance(expected, str):
            self.assertEqual(lines[0], expected.replace("{dir}", self.dir))
        else:
            self.assertRegex(lines[0], expected)
        self.assertEqual(self.listing(), before, "nothing may be left behind")

    def listing(self):
        found = {}
        for root, _, files in os.walk(self.dir):
            for name in files:
                path = os.path.join(root, name)
                if not os.path.isfile(path):  # a named pipe a test made: not to be opened
                    found[path] = None
                    continue
                with open(path, "rb") as f:
                    found[path] = f.read()
            found[root] = None
        return found

    def tokenizer(self):
        path = os.path.join(self.dir, "tok.model")
        result = self.mantissa("tokenize", "train", "--input", LICENCE, "--vocab-size", "500",
                               "--out", path)
        self.assertEqual(result.returncode, 0, result.stderr)
        return path

    def encode_args(self, *inputs, out="out"):
        return ("encode", "--tokenizer", os.path.join(self.dir, "tok.model"),
                "--out-dir", os.path.join(self.dir, out), "--input", *inputs)

    def test_sample_bytes_below_a_block(self):
        self.assert_refused(
            "mantissa: --sample-bytes 100: must be at least 4096 (one block of text)",
            "train", "--input", LICENCE, "--vocab-size", "300", "--sample-bytes", "100", "--out",
            "{dir}/tok.model")

    def test_an_option_given_twice(self):
        # A second value would replace the first without a word; inputs add up.
        self.assert_refused(
            "mantissa: --vocab-size given twice (see mantissa tokenize --help)", "train",
            "--input", LICENCE, "--vocab-size", "300", "--vocab-size", "400", "--out",
            "{dir}/tok.model")

    def test_vocab_sizes_out_of_range(self):
        self.assert_refused(
            "mantissa: --vocab-size 1048577: must be at most 1048576 (model.*.vocab_size's bound)",
            "train", "--input", LICENCE, "--vocab-size", "1048577", "--out", "{dir}/tok.model")
        self.assert_refused(
            "mantissa: --vocab-size 259: must be at least 260 (3 special and 256 byte pieces come "
            "first)", "train", "--input", LICENCE, "--vocab-size", "259", "--out",
            "{dir}/tok.model")
        self.assert_refused(re.compile(
            "^mantissa: cannot train a 30000-piece bpe tokenizer on this text: Vocabulary size "
            r"too high \(30000\)\. Please set it to a value <= \d+\.$"),
            "train", "--input", LICENCE, "--vocab-size", "30000", "--out", "{dir}/tok.model")
        # Above 260 but below the pieces the text's characters need.
        self.assert_refused(re.compile(
            r"^mantissa: cannot train a 261-piece bpe tokenizer on this text: it needs at least "
            r"\d{3} pieces \(3 special, 256 bytes, SentencePiece's space mark U\+2581 and one "
            r"per other character making up 99\.95% of the text\): raise --vocab-size$"),
            "train", "--input", LICENCE, "--vocab-size", "261", "--out", "{dir}/tok.model")
        # One character: 3 + 256 + the space mark + "a".
        one = self.write("one.txt", "a")
        self.assert_refused(
            "mantissa: cannot train a 260-piece bpe tokenizer on this text: it needs at least "
            "261 pieces (3 special, 256 bytes, SentencePiece's space mark U+2581 and one per "
            "other character making up 99.95% of the text): raise --vocab-size",
            "train", "--input", one, "--vocab-size", "260", "--out", "{dir}/tok.model")

    def test_empty_missing_and_non_regular_inputs(self):
        empty = self.write("empty.txt", "")
        missing = os.path.join(self.dir, "missing.txt")
        self.tokenizer()
        for command in (("train", "--vocab-size", "500", "--out", "{dir}/new.model", "--input"),
                        self.encode_args()):
            with self.subTest(command[0]):
                self.assert_refused(f"mantissa: input '{empty}' is empty", *command, LICENCE,
                                    empty)
                self.assert_refused(f"mantissa: cannot read input '{missing}': No such file or "
                                    "directory", *command, missing)
                self.assert_refused(f"mantissa: input '{self.dir}' is not a regular file",
                                    *command, self.dir)
                self.assert_refused("mantissa: input '/proc/version' gives its size as 0 but "
                                    "holds text (a /proc or /sys file): copy it to a file first",
                                    *command, "/proc/version")
                # A named pipe is refused at once, not waited on for a writer.
                fifo = os.path.join(self.dir, "fifo")
                if not os.path.exists(fifo):
                    os.mkfifo(fifo)
                self.assert_refused(f"mantissa: input '{fifo}' is not a regular file (a pipe "
                                    "or a device: write the text to a file first)", *command,
                                    fifo)

    def test_a_file_given_twice(self):
        # Under another name too (a hard link): its text would count twice.
        self.tokenizer()
        text = self.write("text.txt", "some text to read once\n" * 50)
        other = os.path.join(self.dir, "other.txt")
        os.link(text, other)
        for command in (("train", "--vocab-size", "500", "--out", "{dir}/new.model", "--input"),
                        self.encode_args()):
            with self.subTest(command[0]):
                self.assert_refused(f"mantissa: input '{other}' is the same file as input "
                                    f"'{text}': give each file once (its text would count "
                                    "twice)", *command, text, LICENCE, other)

    def test_an_input_that_force_would_replace(self):
        # --force replaces --out, and an encode's shards: never when that is an input, under
        # any name (a symbolic link here), whose text the run would destroy.
        self.tokenizer()
        text = self.write("text.txt", "some text to keep\n" * 50)
        self.assert_refused(f"mantissa: input '{text}' is the file '{text}', which this run "
                            "replaces: its text would be lost; write the output elsewhere",
                            "train", "--vocab-size", "500", "--out", text, "--force",
                            "--input", text)
        os.makedirs(os.path.join(self.dir, "out"))
        shard = os.path.join(self.dir, "out", "train_000000.bin")
        os.rename(text, shard)
        link = os.path.join(self.dir, "link.txt")
        os.symlink(shard, link)
        self.assert_refused(f"mantissa: input '{link}' is the file '{shard}', which this run "
                            "replaces: its text would be lost; write the output elsewhere",
                            *self.encode_args(link), "--force")

    def test_a_file_the_shard_pattern_reads_that_encode_did_not_write(self):
        # Neither removed by --force nor left beside the shards for training's pattern to read.
        self.tokenizer()
        os.makedirs(os.path.join(self.dir, "out"))
        self.write("out/train_notes.bin", "my notes\n")
        for force in ((), ("--force",)):
            with self.subTest(force=force):
                self.assert_refused(
                    f"mantissa: output directory '{self.dir}/out' holds train_notes.bin, which "
                    "training's shard pattern (train_*.bin, val_*.bin) would read, though encode "
                    "did not write it: move it elsewhere", *self.encode_args(LICENCE), *force)

    def test_input_lists_that_cannot_be_read_or_name_no_file(self):
        missing = os.path.join(self.dir, "missing.txt")
        blank = self.write("blank.txt", "\n# nothing here\n\n")
        command = ("train", "--vocab-size", "500", "--out", "{dir}/new.model", "--input-list")
        self.assert_refused(f"mantissa: --input-list '{missing}': cannot open: No such file or "
                            "directory", *command, missing)
        self.assert_refused(f"mantissa: --input-list '{self.dir}': is a directory, not a file",
                            *command, self.dir)
        self.assert_refused(f"mantissa: --input-list '{blank}' names no file", *command, blank)

    def test_invalid_utf8_names_the_file_and_the_offset(self):
        self.tokenizer()
        bad = os.path.join(self.dir, "bad.txt")
        with open(bad, "wb") as f:
            f.write("naïve text\n".encode() + b"then \xc3\x28 a broken sequence\n")
        # Deep in a file encoded in several chunks: the offset counts from the file's start.
        deep = os.path.join(self.dir, "deep.txt")
        with open(deep, "wb") as f:
            f.write(b"ascii line\n" * 300000 + b"\xe2\x82 cut short\n" + b"more\n" * 1000)
        self.assert_refused(f"mantissa: input '{bad}' is not valid UTF-8: byte 0xC3 at offset 17",
                            "train", "--vocab-size", "500", "--out", "{dir}/new.model", "--input",
                            LICENCE, bad)
        self.assert_refused(f"mantissa: input '{bad}' is not valid UTF-8: byte 0xC3 at offset 17",
                            *self.encode_args(LICENCE, bad))
        self.assert_refused(
            f"mantissa: input '{deep}' is not valid UTF-8: byte 0xE2 at offset 3300000",
            *self.encode_args(deep))

    def test_outputs_that_already_exist(self):
        tokenizer = self.tokenizer()
        self.assert_refused(f"mantissa: --out '{tokenizer}' exists; --force replaces it",
                            "train", "--input", LICENCE, "--vocab-size", "600", "--out", tokenizer)
        dangling = os.path.join(self.dir, "dangling.model")
        os.symlink(os.path.join(self.dir, "nowhere"), dangling)
        self.assert_refused(f"mantissa: --out '{dangling}' exists; --force replaces it",
                            "train", "--input", LICENCE, "--vocab-size", "600", "--out", dangling)
        self.assertTrue(os.path.islink(dangling))
        result = self.mantissa("tokenize", *self.encode_args(LICENCE))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assert_refused(
            "mantissa: output directory '{dir}/out' already holds token shards (tokenizer.model, "
            "...); --force replaces them", *self.encode_args(LICENCE))
        self.assert_refused("mantissa: output directory '{dir}/tok.model' exists and is not a "
                            "directory", *self.encode_args(LICENCE, out="tok.model"))

    def test_outputs_that_cannot_be_written_are_refused_before_any_work(self):
        # sysfs takes no new files. The vocab size is too small for the text: training would
        # fail on it, so the output's error shows that nothing was trained first.
        reason = "(Permission denied|Read-only file system)"
        self.assert_refused(
            re.compile(f"^mantissa: --out '/sys/tok.model': cannot create a file in '/sys': "
                       f"{reason}$"),
            "train", "--input", LICENCE, "--vocab-size", "261", "--out", "/sys/tok.model")
        self.tokenizer()
        self.assert_refused(
            re.compile(f"^mantissa: cannot create a temporary file in '/sys': {reason}$"),
            "encode", "--tokenizer", "{dir}/tok.model", "--input", LICENCE, "--out-dir", "/sys")
        # procfs holds neither files nor directories there (ENOENT, though it exists).
        self.assert_refused(
            "mantissa: --out '/proc/tok.model': cannot create a file in '/proc': No such file or "
            "directory",
            "train", "--input", LICENCE, "--vocab-size", "261", "--out", "/proc/tok.model")
        self.assert_refused(
            "mantissa: cannot create output directory '/proc/out': No such file or directory",
            "encode", "--tokenizer", "{dir}/tok.model", "--input", LICENCE, "--out-dir",
            "/proc/out")

    def test_bad_tokenizers_shards_and_options(self):
        junk = self.write("junk.model", "not a model")
        self.assert_refused(f"mantissa: tokenizer '{junk}' is not a SentencePiece model (it does "
                            "not parse as one)",
                            "encode", "--tokenizer", junk, "--out-dir", "{dir}/out", "--input",
                            LICENCE)
        # A file far larger than any model (a sparse one: no disk used) is not read at all.
        huge = os.path.join(self.dir, "huge.model")
        with open(huge, "wb") as f:
            f.truncate(300 << 20)
        self.assert_refused(f"mantissa: tokenizer '{huge}' is 314572800 bytes, more than the 256 "
                            "MiB a SentencePiece model may be (not a tokenizer model?)",
                            "info", "--tokenizer", huge)
        tokenizer = self.tokenizer()
        shard = os.path.join(self.dir, "bad.bin")
        with open(shard, "wb") as f:
            f.write(struct.pack("<3i", 7, 1, 0) + bytes(1012))
        self.assert_refused(f"mantissa: token shard '{shard}': bad magic 7 (expected 20240520 or, "
                            "for uint32 tokens, 20240801; not an llm.c token shard)",
                            "decode", "--tokenizer", tokenizer, "--input", shard)
        cases = {
            ("--val-fraction", "1"): "mantissa: --val-fraction 1: must lie in [0, 1)",
            ("--shard-tokens", "3"): "mantissa: --shard-tokens 3: must lie in [4, 2147483647] "
                                     "(the header's int32 count; a character's up to 4 byte "
                                     "tokens stay in one shard)",
            ("--shard-tokens", "many"): "mantissa: --shard-tokens takes an integer, got 'many' "
                                        "(see mantissa tokenize --help)",
            ("--vocab-size", "5"): "mantissa: tokenize encode: unknown argument '--vocab-size' "
                                   "(see mantissa tokenize --help)",
        }
        for extra, expected in cases.items():
            with self.subTest(extra):
                self.assert_refused(expected, *self.encode_args(LICENCE), *extra)
        self.assert_refused("mantissa: tokenize needs a subcommand: train, encode, decode, info, "
                            "ids or text (see mantissa tokenize --help)")
        self.assert_refused("mantissa: tokenize has no subcommand 'split' (train, encode, "
                            "decode, info, ids or text) (see mantissa tokenize --help)", "split")
        self.assert_refused("mantissa: tokenize encode needs --out-dir DIR (see mantissa "
                            "tokenize --help)", "encode", "--tokenizer", tokenizer, "--input",
                            LICENCE)


if __name__ == "__main__":
    lu.main()
