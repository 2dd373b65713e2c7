"""The pure reducer: specification validation, ``decide`` and ``reduce``."""
