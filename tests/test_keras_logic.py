"""The Keras integration's plain logic, without MPI: learning-rate formulas,
checkpoint file selection, gradient grouping and scaling, schedule
serialization, compression casts, atomic saves, and argument checking."""

from __future__ import annotations

import math
import os

import keras
import pytest
import tensorflow as tf

import hvdkeras as hvd
from hvdkeras.training import checkpoint_naming as cf
from hvdkeras.training import lr_formulas as lr_math
from hvdkeras.training.checkpoint_restore import is_complete_archive
from hvdkeras.training.checkpoint_writing import save_model_atomic
from hvdkeras.training.gradient_reduction import ReductionSettings, plan_groups, scale_factors


# --- learning-rate formulas ---------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 8])
def test_warmup_multiplier_runs_from_one_over_size_to_one(size):
    assert lr_math.warmup_multiplier(0, 5, size) == pytest.approx(1 / size)
    assert lr_math.warmup_multiplier(5, 5, size) == pytest.approx(1.0)
    assert lr_math.warmup_multiplier(2.5, 5, size) == pytest.approx((1 / size + 1) / 2)


def test_epoch_positions():
    assert lr_math.fractional_epoch(2, 1, 4) == 2.25
    assert lr_math.warmup_epoch_at_batch(2, 3, 4) == 3.0   # last batch reaches the epoch end
    assert lr_math.constant_multiplier(0.1, 30)(32) == pytest.approx(0.01)
    assert lr_math.in_epoch_range(3, 3, 5) and not lr_math.in_epoch_range(5, 3, 5)
    assert lr_math.in_epoch_range(10 ** 6, 0, None)


def test_warmup_learning_rate():
    assert lr_math.warmup_learning_rate(0, 0.8, 100, 4) == pytest.approx(0.2)
    assert lr_math.warmup_learning_rate(50, 0.8, 100, 4) == pytest.approx(0.5)


# --- WarmupSchedule -----------------------------------------------------------

def test_warmup_schedule_values_and_config_round_trip():
    after = keras.optimizers.schedules.CosineDecay(0.4, decay_steps=20)
    schedule = hvd.schedules.WarmupSchedule(0.4, warmup_steps=10, after=after, size=4)
    expected = {0: 0.1, 5: 0.25, 9: 0.1 * (1 + 9 * 3 / 10), 10: 0.4,
                20: float(after(10)), 40: float(after(30))}
    for step, value in expected.items():
        assert float(schedule(step)) == pytest.approx(value, rel=1e-6), step

    config = keras.saving.serialize_keras_object(schedule)
    assert config["registered_name"] == "hvdkeras>WarmupSchedule"
    clone = keras.saving.deserialize_keras_object(config)
    assert isinstance(clone, hvd.schedules.WarmupSchedule) and clone.size == 4
    assert isinstance(clone.after, keras.optimizers.schedules.CosineDecay)
    for step in expected:
        assert float(clone(step)) == pytest.approx(float(schedule(step)), rel=1e-7)
    # Also as an optimizer's learning rate.
    optimizer = keras.optimizers.deserialize(
        keras.optimizers.serialize(keras.optimizers.SGD(schedule)))
    assert isinstance(optimizer._learning_rate, hvd.schedules.WarmupSchedule)


def test_warmup_schedule_without_after_or_warmup():
    flat = hvd.schedules.WarmupSchedule(0.3, warmup_steps=0, size=8)
    assert float(flat(0)) == pytest.approx(0.3)
    plain = hvd.schedules.WarmupSchedule(0.3, warmup_steps=4, size=2)
    assert [round(float(plain(s)), 6) for s in range(6)] == [0.15, 0.1875, 0.225, 0.2625, 0.3, 0.3]


def test_world_size_needed_before_init():
    with pytest.raises(ValueError, match="hvdkeras.init"):
        hvd.schedules.WarmupSchedule(0.1, warmup_steps=10)
    with pytest.raises(ValueError, match="hvdkeras.init"):
        hvd.scale_lr(0.1)
    with pytest.raises(TypeError, match="WarmupSchedule"):
        hvd.scale_lr(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5))


# --- checkpoint files ---------------------------------------------------------

def test_checkpoint_names():
    assert cf.checkpoint_name(3) == "epoch-00003.keras"
    assert cf.parse_checkpoint_name("epoch-00003.keras") == 3
    temporary = cf.temporary_name("epoch-00003.keras", "42")
    assert cf.is_temporary(temporary) and temporary.endswith(".keras")
    assert cf.parse_checkpoint_name(temporary) is None
    assert cf.parse_checkpoint_name("epoch-3.keras.bak") is None
    # Mid-epoch checkpoints: (finished epochs, steps into the next epoch).
    assert cf.checkpoint_name(3, 40) == "epoch-00003-step-0000040.keras"
    assert cf.checkpoint_name(3, 0) == "epoch-00003.keras"
    assert cf.parse_checkpoint_position("epoch-00003-step-0000040.keras") == (3, 40)
    assert cf.parse_checkpoint_position("epoch-00003.keras") == (3, 0)
    assert cf.parse_checkpoint_name("epoch-00003-step-0000040.keras") == 3
    assert cf.parse_checkpoint_position("epoch-00003-step-.keras") is None
    with pytest.raises(ValueError, match="epoch and step must be >= 0"):
        cf.checkpoint_name(1, -1)


def test_newest_first_orders_by_position():
    names = ["epoch-00002.keras", "epoch-00002-step-0000007.keras", "epoch-00001-step-0000020.keras",
             "epoch-00002-step-0000014.keras"]
    assert [n for _, n in cf.newest_first(names)] == [
        "epoch-00002-step-0000014.keras", "epoch-00002-step-0000007.keras", "epoch-00002.keras",
        "epoch-00001-step-0000020.keras"]
    assert cf.files_to_prune(names, 3) == ["epoch-00001-step-0000020.keras"]


def test_step_checkpoints_and_best_only_do_not_mix():
    with pytest.raises(ValueError, match="every_steps saves mid-epoch checkpoints"):
        hvd.callbacks.CheckpointCallback("ck", every_steps=10, save_best_only=True)
    with pytest.raises(ValueError, match="every_steps must be None or an integer >= 1"):
        hvd.callbacks.CheckpointCallback("ck", every_steps=0)


def test_newest_first_and_pruning():
    names = ["epoch-00002.keras", "notes.txt", ".tmp-1-epoch-00009.keras", "epoch-00010.keras",
             "epoch-00001.keras", cf.STATE_FILE]
    assert cf.newest_first(names) == [(10, "epoch-00010.keras"), (2, "epoch-00002.keras"),
                                      (1, "epoch-00001.keras")]
    assert cf.files_to_prune(names, 2) == ["epoch-00001.keras"]
    assert cf.files_to_prune(names, None) == []


def test_best_tracking():
    assert cf.resolve_mode("auto", "val_accuracy") == "max"
    assert cf.resolve_mode("auto", "val_loss") == "min"
    with pytest.raises(ValueError, match="mode"):
        cf.resolve_mode("largest", "val_loss")
    assert cf.improved(1.0, None, "min")
    assert cf.improved(0.5, 1.0, "min") and not cf.improved(1.5, 1.0, "min")
    assert cf.improved(1.5, 1.0, "max")
    assert not cf.improved(math.nan, 1.0, "min")


def _small_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    return model


def test_atomic_save_publishes_a_complete_file_or_nothing(tmp_path):
    model = _small_model()
    path = str(tmp_path / "epoch-00001.keras")
    save_model_atomic(model, path)
    assert os.listdir(tmp_path) == ["epoch-00001.keras"] and is_complete_archive(path)
    with open(path, "rb") as f:
        data = f.read()
    truncated = tmp_path / "epoch-00002.keras"
    truncated.write_bytes(data[: len(data) // 2])
    assert not is_complete_archive(str(truncated))
    with pytest.raises(ValueError):          # Keras refuses the suffix before writing
        save_model_atomic(model, str(tmp_path / "model.txt"))
    assert sorted(os.listdir(tmp_path)) == ["epoch-00001.keras", "epoch-00002.keras"]


# --- gradient grouping and scaling ----------------------------------------------

def test_plan_groups():
    assert plan_groups([]) == []
    assert plan_groups([0, 1, 2, 3, 4]) == [[0, 1, 2, 3, 4]]
    assert plan_groups([0, 1, 2, 3, 4], num_groups=2) == [[0, 1, 2], [3, 4]]
    assert plan_groups([0, 2, 3], num_groups=5) == [[0], [2], [3]]
    assert plan_groups([0, 1, 2, 3], explicit=[[3, 1], [1, 9]]) == [[1, 3], [0, 2]]
    assert plan_groups([0, 1], explicit=[[0, 1]]) == [[0, 1]]


def test_scale_factors():
    assert scale_factors(hvd.Average, 1.0, 8) == (hvd.Average, 1.0, 1.0)
    assert scale_factors(hvd.Average, 4.0, 8) == (hvd.Sum, 0.25, 0.5)
    assert scale_factors(hvd.Sum, 1.0, 8) == (hvd.Sum, 1.0, 1.0)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(op=hvd.Min), ValueError, "Average, Sum or Adasum, got Min"),
    (dict(op=hvd.Sum, gradient_predivide_factor=2.0), ValueError, "only applies to op"),
    (dict(gradient_predivide_factor=0.0), ValueError, "positive"),
    (dict(num_groups=-1), ValueError, "num_groups"),
    (dict(num_groups=2, groups=[[]]), ValueError, "not both"),
    (dict(compression="fp16"), TypeError, "hvdkeras.Compression"),
])
def test_reduction_settings_are_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        ReductionSettings(**kwargs)


# --- compression casts --------------------------------------------------------

@pytest.mark.parametrize("compressor, wire", [(hvd.Compression.fp16, tf.float16),
                                              (hvd.Compression.bf16, tf.bfloat16)])
def test_compressors_cast_floats_only(compressor, wire):
    for dtype in (tf.float32, tf.float64):
        sent, context = compressor.compress(tf.constant([1.5, -2.0], dtype))
        assert sent.dtype == wire
        back = compressor.decompress(sent, context)
        assert back.dtype == dtype and back.numpy().tolist() == [1.5, -2.0]
    ints, context = compressor.compress(tf.constant([3], tf.int32))
    assert ints.dtype == tf.int32 and compressor.decompress(ints, context).dtype == tf.int32
    same, _ = compressor.compress(tf.constant([1.0], wire))
    assert same.dtype == wire
    assert hvd.Compression.none.compress(tf.constant([1.0]))[0].dtype == tf.float32


# --- DistributedOptimizer / DistributedGradientTape arguments ------------------

def test_distributed_optimizer_keeps_class_identity_and_state():
    model = _small_model()
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    slots = [id(v) for v in optimizer.variables]
    wrapped = hvd.DistributedOptimizer(optimizer)
    assert wrapped is optimizer and hvd.is_distributed(wrapped)
    assert isinstance(wrapped, keras.optimizers.Adam)
    assert type(wrapped).__name__ == "Adam" and type(wrapped).__module__ == "keras.src.optimizers.adam"
    assert [id(v) for v in wrapped.variables] == slots
    assert wrapped.get_config() == keras.optimizers.Adam.from_config(wrapped.get_config()).get_config()
    named = hvd.DistributedOptimizer("sgd")
    assert type(named).__name__ == "SGD" and hvd.is_distributed(named)
    # Horovod's placement arguments are accepted (hvdkeras places reductions itself).
    placed = hvd.DistributedOptimizer("adam", device_dense="/gpu:0", device_sparse="/cpu:0")
    assert hvd.is_distributed(placed)
    with tf.GradientTape() as tape:
        pass
    assert hvd.DistributedGradientTape(tape, device_dense="/gpu:0", device_sparse="") is not None


def test_distributed_optimizer_adds_the_loss_scale_optimizer_under_mixed_float16():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        wrapped = hvd.DistributedOptimizer(keras.optimizers.Adam(0.1))
    finally:
        keras.config.set_dtype_policy("float32")
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer) and hvd.is_distributed(wrapped)
    assert isinstance(wrapped.inner_optimizer, keras.optimizers.Adam)
    assert not hvd.is_distributed(wrapped.inner_optimizer)


@pytest.mark.parametrize("make, kwargs, error, match", [
    (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD()), {}, ValueError, "already distributed"),
    (lambda: object(), {}, TypeError, "Keras 3 optimizer"),
    (lambda: keras.optimizers.SGD(), dict(backward_passes_per_step=0), ValueError, ">= 1"),
    (lambda: keras.optimizers.SGD(), dict(op=hvd.Max), ValueError, "got Max"),
])
def test_distributed_optimizer_arguments_are_checked(make, kwargs, error, match):
    with pytest.raises(error, match=match):
        hvd.DistributedOptimizer(make(), **kwargs)


def test_distributed_gradient_tape_arguments_are_checked():
    with pytest.raises(TypeError, match="tf.GradientTape"):
        hvd.DistributedGradientTape(object())
    tape = hvd.DistributedGradientTape(tf.GradientTape())
    assert isinstance(tape, tf.GradientTape)
    with pytest.raises(ValueError, match="already distributed"):
        hvd.DistributedGradientTape(tape)


def test_learning_rate_schedules_cannot_be_set_by_callbacks():
    from hvdkeras.training import lr_variable as lr_access

    decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    with pytest.raises(TypeError, match="ExponentialDecay.*WarmupSchedule"):
        lr_access.check_settable(keras.optimizers.SGD(decay), "SomeCallback")
    multi = keras.optimizers.MultiOptimizer(lambda v: keras.optimizers.SGD(0.1))
    with pytest.raises(TypeError, match="MultiOptimizer"):
        lr_access.check_settable(multi, "SomeCallback")
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    lr_access.check_settable(optimizer, "SomeCallback")
    lr_access.set_learning_rate(optimizer, 0.25)
    assert lr_access.get_learning_rate(optimizer) == pytest.approx(0.25)


def test_fit_verbose_without_a_terminal_is_two():
    assert hvd.fit_verbose() == 2      # pytest captures stdout: not a TTY


def test_momentum_correction_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="momentum is a Python float"):
        hvd.callbacks.LearningRateWarmupCallback(0.1, momentum_correction=True)
    with pytest.raises(ValueError, match="momentum_correction=False"):
        hvd.callbacks.LearningRateScheduleCallback(0.1, 0.5, momentum_correction=True)
