"""`hvdkeras migrate`: a Horovod + Keras 2 script rewritten for hvdkeras + Keras 3.

The script is parsed with `ast`; each rule finds its nodes in the tree and
turns them into text edits at their exact source positions (`edits`), so
comments, layout and everything no rule touches stay as they were. What a
rule recognises but cannot rewrite safely is reported instead. Pure: text in,
text and report out.

What may import this module: the CLI (`hvdkeras migrate`) and tests.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import List, Optional, Set

from hvdkeras.migrate.edits import Edit, Locator, apply

# Horovod's Keras-facing modules, all of which hvdkeras replaces.
HOROVOD_MODULES = {"horovod.tensorflow.keras": "hvdkeras", "horovod.keras": "hvdkeras",
                   "horovod.tensorflow": "hvdkeras", "horovod.torch": "hvdkeras",
                   "horovod.tensorflow.keras.callbacks": "hvdkeras.callbacks",
                   "horovod.keras.callbacks": "hvdkeras.callbacks",
                   "horovod.spark": "hvdkeras.spark",
                   "horovod.spark.keras": "hvdkeras.spark.keras",
                   "horovod.spark.common.store": "hvdkeras.spark.store",
                   "horovod.spark.common.backend": "hvdkeras.spark.keras"}
OPTIMIZER_CLASSES = {"SGD", "Adam", "AdamW", "Adamax", "Adadelta", "Adagrad", "Nadam", "RMSprop",
                     "Ftrl", "Lion", "Adafactor"}
# Horovod names hvdkeras does not offer (yet or at all), with what to do instead.
NOT_IN_HVDKERAS = {
    "broadcast_global_variables": "TensorFlow 1 graph code only (eagerly it raises): use "
                                  "hvd.callbacks.BroadcastGlobalVariablesCallback(0) or "
                                  "hvd.broadcast_model(model)",
}
# horovod.torch names hvdkeras does not offer, with what to do instead.
NOT_IN_HVDKERAS_TORCH = {
    **dict.fromkeys(("allreduce_async", "allreduce_async_", "allgather_async",
                     "broadcast_async", "broadcast_async_", "grouped_allreduce_async",
                     "synchronize", "poll"),
                    "horovod.torch's handles: call the blocking collective "
                    "(hvd.allreduce, hvd.allgather, hvd.broadcast) instead; the "
                    "DistributedOptimizer's hooks already reduce during backward()"),
    "allreduce_": "in-place allreduce: write t.copy_(hvd.allreduce(t))",
    "SyncBatchNorm": "use torch.nn.SyncBatchNorm's statistics with hvd.allreduce, or a Keras "
                     "model with hvd.SyncBatchNormalization",
}
# A torch optimizer's `lr=` is its own name, not Keras 2's.
TORCH_OPTIMIZER_PREFIXES = ("torch.optim.", "optim.")
_TF1_SESSION = {"get_session", "set_session", "Session", "ConfigProto"}


@dataclasses.dataclass
class Migration:
    """The rewritten script and what happened to it.

    Attributes:
        text: The new source.
        changes: (line, what changed), in line order.
        notes: (line, what was recognised but not changed, and what to do).
    """

    text: str
    changes: List[tuple] = dataclasses.field(default_factory=list)
    notes: List[tuple] = dataclasses.field(default_factory=list)

    def report(self, filename: str) -> str:
        lines = [f"{filename}:{line}: {what}" for line, what in self.changes]
        lines += [f"{filename}:{line}: not changed: {what}" for line, what in self.notes]
        summary = f"{len(self.changes)} change(s), {len(self.notes)} place(s) left to you"
        return "\n".join(lines + [summary])


def dotted(node: ast.AST) -> Optional[str]:
    """"a.b.c" for a chain of attribute accesses on a name; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


class _Rules(ast.NodeVisitor):
    def __init__(self, source: str) -> None:
        self.source = source
        self.at = Locator(source)
        self.edits: List[Edit] = []
        self.notes: List[tuple] = []
        self.tf_names: Set[str] = set()
        self.hvd_names: Set[str] = set()
        self.backend_names: Set[str] = set()  # names bound to keras.backend
        self.has_keras_import = False
        self.keras_import_after: Optional[int] = None  # line of the tensorflow import
        self.uses_tf_keras = False
        self.torch_script = False  # imports horovod.torch

    def edit(self, start: int, end: int, text: str, line: int, what: str) -> None:
        self.edits.append(Edit(start, end, text, line, what))

    def replace(self, node: ast.AST, text: str, what: str) -> None:
        self.edit(self.at.start(node), self.at.end(node), text, node.lineno, what)

    def note(self, node: ast.AST, what: str) -> None:
        self.notes.append((node.lineno, what))

    # --- imports -------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "tensorflow":
                self.tf_names.add(alias.asname or "tensorflow")
                self.keras_import_after = self.keras_import_after or node.end_lineno
            elif alias.name == "keras" and alias.asname is None:
                self.has_keras_import = True
            elif alias.name == "hvdkeras":  # migrated already, or written for hvdkeras
                self.hvd_names.add(alias.asname or "hvdkeras")
            elif alias.name == "horovod" and alias.asname is None and len(node.names) == 1:
                # `horovod.run(...)`: the top-level names hvdkeras has too.
                self.hvd_names.add("horovod")
                self.replace(node, "import hvdkeras as horovod", "import horovod -> hvdkeras")
            elif alias.name in HOROVOD_MODULES or alias.name == "horovod":
                if len(node.names) > 1 or alias.asname is None:
                    self.note(node, f"'import {alias.name}' without 'as' (or with other modules): "
                                    "import hvdkeras as hvd and use hvd.<name>")
                    continue
                self.hvd_names.add(alias.asname)
                self.replace(node, f"import {HOROVOD_MODULES.get(alias.name, 'hvdkeras')} as "
                                   f"{alias.asname}", f"import {alias.name} -> hvdkeras")
                if alias.name == "horovod.torch":
                    self.torch_script = True
                    self.note(node, "a horovod.torch script: run it with KERAS_BACKEND=torch, "
                                    "so that hvd.allreduce and the other collectives take and "
                                    "return torch tensors (DistributedOptimizer, "
                                    "broadcast_parameters and broadcast_optimizer_state work "
                                    "under any backend)")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.endswith("keras"):
            self.backend_names |= {a.asname or a.name for a in node.names if a.name == "backend"}
        new_module = None
        if module in HOROVOD_MODULES:
            new_module = HOROVOD_MODULES[module]
        elif module.startswith("horovod"):
            self.note(node, f"from {module} import ...: hvdkeras has no such module")
        elif module == "tensorflow" and any(a.name == "keras" for a in node.names):
            keras = [a for a in node.names if a.name == "keras"][0]
            rest = [a for a in node.names if a.name != "keras"]
            text = "import keras" + (f" as {keras.asname}" if keras.asname else "")
            if rest:
                text = ast.unparse(ast.ImportFrom(module="tensorflow", names=rest, level=0)) \
                    + "\n" + " " * node.col_offset + text
            self.has_keras_import = self.has_keras_import or keras.asname is None
            self.replace(node, text, "from tensorflow import keras -> import keras (Keras 3)")
            return
        elif module.startswith("tensorflow.python.keras"):
            self.note(node, f"from {module} import ...: TensorFlow's private Keras 2 copy; "
                            "import the names from keras")
        elif module.startswith("tensorflow.keras") or module.startswith("keras.optimizers.legacy"):
            new_module = "keras" + module[len("tensorflow.keras"):] \
                if module.startswith("tensorflow.keras") else module
            new_module = new_module.replace("optimizers.legacy", "optimizers")
        if new_module is not None:
            rebuilt = ast.ImportFrom(module=new_module, names=node.names, level=0)
            self.replace(node, ast.unparse(rebuilt), f"from {module} -> from {new_module}")

    # --- names used in code ----------------------------------------------------

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = dotted(node)
        if isinstance(node.value, ast.Name) and node.value.id in self.tf_names:
            if node.attr == "keras":
                self.uses_tf_keras = True
                self.replace(node, "keras", f"{node.value.id}.keras -> keras (Keras 3)")
            elif node.attr in ("compat", "Session", "ConfigProto"):
                self.note(node, f"{chain}: TensorFlow 1 API; Keras 3 runs eagerly in TensorFlow 2")
        elif node.attr == "legacy" and (dotted(node.value) or "").endswith("optimizers"):
            self.edit(self.at.end(node.value), self.at.end(node), "", node.lineno,
                      "optimizers.legacy -> optimizers (Keras 3 has no legacy optimizers)")
        elif node.attr in _TF1_SESSION and ((dotted(node.value) or "").endswith("backend") or (
                isinstance(node.value, ast.Name) and node.value.id in self.backend_names)):
            self.note(node, f"{chain}: Keras 3 has no sessions; remove it")
        elif chain and chain.split(".", 1)[0] in self.hvd_names and node.attr in NOT_IN_HVDKERAS:
            self.note(node, f"{chain}: {NOT_IN_HVDKERAS[node.attr]}")
        elif chain and chain.split(".", 1)[0] in self.hvd_names and self.torch_script \
                and node.attr in NOT_IN_HVDKERAS_TORCH:
            self.note(node, f"{chain}: {NOT_IN_HVDKERAS_TORCH[node.attr]}")
        self.generic_visit(node)

    # --- calls -------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        name = dotted(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        torch_optimizer = name.startswith(TORCH_OPTIMIZER_PREFIXES) or (
            self.torch_script and "keras" not in name)
        if last in OPTIMIZER_CLASSES and not torch_optimizer:
            self._optimizer_arguments(node)
        if last == "compile":
            for keyword in node.keywords:
                if keyword.arg == "experimental_run_tf_function":
                    self._remove_keyword(node, keyword, "compile(experimental_run_tf_function=) "
                                                        "dropped (Keras 3 has no such argument)")
        if last == "variables" and isinstance(node.func, ast.Attribute) and not node.args \
                and not node.keywords:
            self.edit(self.at.end(node.func), self.at.end(node), "", node.lineno,
                      f"{name}() -> {name} (a property in Keras 3)")
        if last in ("save_weights", "load_weights") and node.args:
            self._weights_path(node.args[0], ".weights.h5", f"{last}() path")
        if last == "ModelCheckpoint":
            self._checkpoint_path(node)
        if last in ("fit_generator", "evaluate_generator", "predict_generator") \
                and isinstance(node.func, ast.Attribute):
            self._generator_method(node, last)
        if last == "save" and isinstance(node.func, ast.Attribute) and len(node.args) == 1 \
                and (dotted(node.func.value) or "").lower().endswith("model"):
            self._model_save(node, name)
        if name.endswith("train.latest_checkpoint"):
            self.note(node, f"{name}: Keras 3 writes no TensorFlow checkpoints; find the "
                            "newest .weights.h5/.keras file instead (or use "
                            "hvd.callbacks.CheckpointCallback and hvd.restore_from_checkpoint)")
        self.generic_visit(node)

    def _optimizer_arguments(self, node: ast.Call) -> None:
        for keyword in node.keywords:
            if keyword.arg == "lr":
                start = self.at.start(keyword)
                self.edit(start, start + 2, "learning_rate", keyword.lineno,
                          "lr= -> learning_rate= (Keras 3)")
            elif keyword.arg == "decay":
                self.note(keyword, "decay= is gone in Keras 3 optimizers; use a "
                                   "keras.optimizers.schedules learning-rate schedule")

    def _remove_keyword(self, call: ast.Call, keyword: ast.keyword, what: str) -> None:
        """Removes `keyword` and one comma next to it."""
        arguments = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
        index = arguments.index(keyword)
        if index > 0:
            start, end = self.at.end(arguments[index - 1]), self.at.end(keyword)
        elif len(arguments) > 1:
            start, end = self.at.start(keyword), self.at.start(arguments[1])
        else:
            start, end = self.at.start(keyword), self.at.end(keyword)
        self.edit(start, end, "", keyword.lineno, what)

    def _weights_path(self, node: ast.AST, suffix: str, what: str) -> None:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            self._runtime_path(node, suffix, what)
            return
        path = node.value
        if path.endswith(suffix):
            return
        stem = path
        for old in (".weights.h5", ".h5", ".hdf5", ".ckpt", ".keras"):
            if stem.endswith(old):
                stem = stem[:-len(old)]
                break
        written = self.source[self.at.start(node):self.at.end(node)]
        quote = written[:1]
        simple = quote in ("'", '"') and written[-1:] == quote and "\\" not in written \
            and written[1:-1] == path
        literal = f"{quote}{stem + suffix}{quote}" if simple else repr(stem + suffix)
        self.replace(node, literal, f"{what} {path!r} -> {stem + suffix!r} "
                                    f"(Keras 3 needs {suffix})")

    def _runtime_path(self, node: ast.AST, suffix: str, what: str) -> None:
        """A path built at run time: wrapped in hvdkeras's mapping, which gives
        it Keras 3's ending when the script runs (or, with no hvdkeras import
        to call it through, reported)."""
        function = "keras3_weights_path" if suffix == ".weights.h5" else "keras3_model_path"
        if not self.hvd_names:
            self.note(node, f"{what} is built at run time: make it end in {suffix}, or import "
                            f"hvdkeras and wrap it in hvdkeras.{function}(...)")
            return
        written = self.source[self.at.start(node):self.at.end(node)]
        if written.startswith(tuple(f"{name}.keras3_" for name in self.hvd_names)):
            return  # migrated already
        alias = sorted(self.hvd_names)[0]
        self.replace(node, f"{alias}.{function}({written})",
                     f"{what} built at run time -> {alias}.{function}(...) (Keras 3 needs "
                     f"{suffix})")

    def _generator_method(self, node: ast.Call, last: str) -> None:
        """fit_generator and friends -> fit/evaluate/predict, which take generators
        in Keras 3; the arguments Keras 3 dropped go too."""
        assert isinstance(node.func, ast.Attribute)
        new = last[:-len("_generator")]
        start = self.at.end(node.func.value) + 1
        self.edit(start, start + len(last), new, node.lineno,
                  f"{last}() -> {new}() (Keras 3 takes generators in {new})")
        for keyword in node.keywords:
            if keyword.arg in ("workers", "use_multiprocessing", "max_queue_size"):
                self._remove_keyword(node, keyword, f"{last}({keyword.arg}=) dropped (Keras 3's "
                                                    f"{new} has no such argument)")

    def _model_save(self, node: ast.Call, name: str) -> None:
        """`model.save(path)`: Keras 3 writes .keras (or legacy .h5) files, not
        SavedModel directories or TensorFlow checkpoints."""
        path = node.args[0]
        if isinstance(path, ast.Constant) and isinstance(path.value, str):
            if not path.value.endswith((".keras", ".h5")):
                self._weights_path(path, ".keras", f"{name}() path")
        else:
            self._runtime_path(path, ".keras", f"{name}() path")

    def _checkpoint_path(self, node: ast.Call) -> None:
        weights_only = any(k.arg == "save_weights_only" and isinstance(k.value, ast.Constant)
                           and k.value.value is True for k in node.keywords)
        path = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg == "filepath"), None)
        if path is not None:
            self._weights_path(path, ".weights.h5" if weights_only else ".keras",
                               "ModelCheckpoint path")

    def finish(self) -> None:
        if self.uses_tf_keras and not self.has_keras_import and self.keras_import_after:
            at = self.at.line_end(self.keras_import_after)
            self.edit(at, at, "import keras\n", self.keras_import_after,
                      "added 'import keras' (Keras 3 is its own package)")


def migrate(source: str) -> Migration:
    """Rewrites a Horovod + Keras 2 script for hvdkeras + Keras 3.

    Args:
        source: The script's text.

    Returns:
        A `Migration`: the new text, the changes made and the places left to you.

    Raises:
        SyntaxError: when `source` is not valid Python.

    Example:

    ```python
    result = migrate(open("train.py").read())
    print(result.report("train.py"))
    ```
    """
    tree = ast.parse(source)
    rules = _Rules(source)
    rules.visit(tree)
    rules.finish()
    text, applied, skipped = apply(source, rules.edits)
    notes = list(rules.notes) + [(e.line, f"overlaps another change; do it by hand: {e.what}")
                                 for e in skipped]
    return Migration(text=text, changes=sorted((e.line, e.what) for e in applied),
                     notes=sorted(notes))
