"""A user's own registered optimizer subclass (importable without hvdkeras)."""

import keras


@keras.saving.register_keras_serializable(package="hvdkeras_tests")
class ScaledSGD(keras.optimizers.SGD):
    """SGD whose step is multiplied by a constant `boost`."""

    def __init__(self, learning_rate=0.01, boost=2.0, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.boost = boost

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(gradient * self.boost, variable, learning_rate)

    def get_config(self):
        return {**super().get_config(), "boost": self.boost}
