"""The callbacks on 2 ranks: start-of-training sync, metric averaging, and
learning rates at chosen batches against the formulas (written out here)."""

import keras
import numpy as np
import pytest

import hvdkeras as hvd
from keras_helpers import (assert_weights_close, mlp, regression_data, run_reference, shard,
                           spread_over_ranks, variable_values)


class Recorder(keras.callbacks.Callback):
    """Records what the next train step will use, and raw epoch logs."""

    def __init__(self):
        super().__init__()
        self.first_step_state = None
        self.learning_rates = []      # (epoch, batch, lr)
        self.epoch_logs = []
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_step_state is None:
            self.first_step_state = (variable_values(self.model.variables),
                                     variable_values(self.model.optimizer.variables))
        lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        self.learning_rates.append((self._epoch, batch, lr))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs or {}))


def _rank_data(rows=16):
    """Different data on every rank."""
    return regression_data(seed=40 + hvd.rank(), rows=rows)


def test_different_seeds_are_identical_before_step_one():
    model = mlp(seed=100 + hvd.rank())
    optimizer = keras.optimizers.Adam(0.001 * (hvd.rank() + 1))
    optimizer.build(model.trainable_variables)
    # Give every rank its own optimizer state too (as if each had loaded its own).
    optimizer.iterations.assign(3 + hvd.rank())
    for v in optimizer.variables[2:]:
        v.assign(np.full(v.shape, 0.25 * (hvd.rank() + 1), dtype=v.dtype))
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer), loss="mse")
    before = (variable_values(model.variables), variable_values(model.optimizer.variables))
    assert spread_over_ranks(before[0], "t_model_before") > 0
    assert spread_over_ranks(before[1], "t_opt_before") > 0

    recorder = Recorder()
    x, y = _rank_data(rows=4)
    model.fit(x, y, batch_size=4, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), recorder])
    model_state, optimizer_state = recorder.first_step_state
    assert spread_over_ranks(model_state, "t_model_after") == 0
    assert spread_over_ranks(optimizer_state, "t_opt_after") == 0
    if hvd.rank() == 0:  # everyone got rank 0's state
        for got, expected in zip(model_state + optimizer_state, before[0] + before[1]):
            np.testing.assert_array_equal(got, expected)


def test_local_variables_keep_their_own_values():
    """Horovod's local_variables=: those stay as each rank made them; the rest is rank 0's."""
    model = mlp(seed=200 + hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    local = model.layers[0].trainable_variables
    before = variable_values(local)
    recorder = Recorder()
    x, y = _rank_data(rows=4)
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0, device="", local_variables=local),
        hvd.callbacks.MetricAverageCallback(device=""), recorder])
    state = dict(zip([v.path for v in model.variables], recorder.first_step_state[0]))
    local_paths = {v.path for v in local}
    shared = [value for path, value in state.items() if path not in local_paths]
    assert spread_over_ranks(shared, "local_vars_shared") == 0
    assert spread_over_ranks([state[v.path] for v in local], "local_vars_local") > 0
    for got, expected in zip([state[v.path] for v in local], before):
        np.testing.assert_array_equal(got, expected)


def test_unbuilt_optimizer_is_built_and_synced_before_step_one():
    model = mlp(seed=200 + hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.01 * (hvd.rank() + 1), momentum=0.9)), loss="mse")
    assert not model.optimizer.built
    recorder = Recorder()
    x, y = _rank_data(rows=4)
    model.fit(x, y, batch_size=4, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), recorder])
    model_state, optimizer_state = recorder.first_step_state
    # iteration, learning rate, and one momentum slot per weight
    assert len(optimizer_state) == 2 + len(model.trainable_variables)
    assert spread_over_ranks(model_state + optimizer_state, "t_unbuilt_after") == 0
    assert recorder.learning_rates[0][2] == pytest.approx(0.01)


def test_a_model_that_fit_builds_starts_from_the_roots_weights():
    """No keras.Input (Horovod's examples): ranks initialize differently, and the
    broadcast inside the first step makes them train like one process that
    started from rank 0's weights."""
    steps, per_rank = 4, 4
    x, y = regression_data(seed=5, rows=steps * hvd.size() * per_rank)

    def unbuilt(seed):
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])

    model = unbuilt(100 + hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
    mine = (shard(x, steps, per_rank), shard(y, steps, per_rank))
    model.fit(*mine, batch_size=per_rank, shuffle=False, verbose=0, callbacks=[callback])
    assert callback.broadcast_done
    reference = run_reference(lambda: _compiled_sgd(unbuilt(100)), x, y,
                              batch_size=hvd.size() * per_rank)
    assert_weights_close(model.get_weights(), reference.get_weights(), "built by fit")
    # A second fit() with the same callback trains on without another broadcast.
    model.fit(*mine, batch_size=per_rank, shuffle=False, verbose=0, callbacks=[callback])
    reference.fit(x, y, batch_size=hvd.size() * per_rank, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), reference.get_weights(), "second fit")


def _compiled_sgd(model):
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def test_metric_average_makes_every_history_identical():
    model = mlp(seed=7)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse",
                  metrics=["mae"])
    x, y = _rank_data(rows=16)
    raw = Recorder()
    history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, validation_data=(x[:8], y[:8]),
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), raw,
                                   hvd.callbacks.MetricAverageCallback()])
    keys = sorted(history.history)
    assert keys == ["loss", "mae", "val_loss", "val_mae"]
    local = np.array([[logs[k] for k in keys] for logs in raw.epoch_logs])
    averaged = np.array([history.history[k] for k in keys]).T
    assert spread_over_ranks([local], "t_raw_logs") > 0, "ranks saw the same data: vacuous test"
    assert spread_over_ranks([averaged], "t_history") == 0
    mean_of_local = hvd.allreduce(local, op=hvd.Average, name="t_mean_logs").numpy()
    np.testing.assert_allclose(averaged, mean_of_local, rtol=1e-6)


def _fit_recording_lr(optimizer, callbacks, epochs, rows=16, batch_size=4, **kwargs):
    model = mlp(seed=8)
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer), loss="mse")
    recorder = Recorder()
    x, y = regression_data(seed=9, rows=rows)
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   *callbacks, recorder], **kwargs)
    return recorder.learning_rates, history


def test_warmup_callback_follows_the_formula():
    size, steps, warmup_epochs, target = hvd.size(), 4, 2, 0.1
    rates, history = _fit_recording_lr(
        keras.optimizers.SGD(0.5),
        [hvd.callbacks.LearningRateWarmupCallback(target, warmup_epochs=warmup_epochs)], epochs=3)
    assert len(rates) == 3 * steps
    for epoch, batch, lr in rates:
        if epoch < warmup_epochs:
            e = epoch + (batch + 1) / steps
            expected = target / size * (e * (size - 1) / warmup_epochs + 1)
        else:
            expected = target        # left where warmup ended
        assert lr == pytest.approx(expected, rel=1e-6), (epoch, batch)
    assert rates[0][2] < target / size * 1.2             # starts near target/size
    assert history.history["learning_rate"][-1] == pytest.approx(target)


def test_schedule_callbacks_follow_the_formulas():
    steps = 4
    staircase = hvd.callbacks.LearningRateScheduleCallback(0.2, 0.5, start_epoch=1, end_epoch=3)
    smooth = hvd.callbacks.LearningRateScheduleCallback(
        0.3, lambda e: 1.0 / (1.0 + e), start_epoch=3, staircase=False)
    rates, _ = _fit_recording_lr(keras.optimizers.SGD(0.7), [staircase, smooth], epochs=5)
    for epoch, batch, lr in rates:
        if epoch == 0:
            expected = 0.7                                  # before any range: untouched
        elif epoch < 3:
            expected = 0.2 * 0.5 ** (epoch - 1)             # staircase, constant multiplier
        else:
            expected = 0.3 / (1.0 + epoch + batch / steps)  # fractional epoch
        assert lr == pytest.approx(expected, rel=1e-6), (epoch, batch)


def test_schedule_callback_rejects_a_schedule_learning_rate():
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    with pytest.raises(TypeError, match="WarmupSchedule"):
        _fit_recording_lr(keras.optimizers.SGD(decay),
                          [hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1)],
                          epochs=1)


def test_warmup_schedule_in_training_follows_the_formula():
    size, warmup, target = hvd.size(), 6, 0.2
    after = keras.optimizers.schedules.ExponentialDecay(target, decay_steps=4, decay_rate=0.5)
    schedule = hvd.schedules.WarmupSchedule(target, warmup_steps=warmup, after=after)
    assert schedule.size == size
    rates, _ = _fit_recording_lr(keras.optimizers.SGD(schedule), [], epochs=3)
    for step, (_, _, lr) in enumerate(rates):
        if step < warmup:
            expected = target / size * (1 + step * (size - 1) / warmup)
        else:
            expected = target * 0.5 ** ((step - warmup) / 4)
        assert lr == pytest.approx(expected, rel=1e-6), step
    clone = hvd.schedules.WarmupSchedule.from_config(schedule.get_config())
    for step in (0, 3, 6, 9):
        assert float(clone(step)) == pytest.approx(float(schedule(step)), rel=1e-7)


def test_rank_helpers():
    # pytest captures stdout, so rank 0 sees a non-terminal and gets one line per epoch.
    assert hvd.fit_verbose() == (2 if hvd.rank() == 0 else 0)
    assert hvd.scale_lr(0.1) == pytest.approx(0.1 * hvd.size())
