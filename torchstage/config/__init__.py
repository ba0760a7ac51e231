"""The config API: YAML files -> the ``train(...)`` call; ``torchstage run -C`` drives it."""
