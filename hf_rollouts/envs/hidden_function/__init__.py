from .env import HiddenFunctionConfig, HiddenFunctionEnv, hidden_f

__all__ = ["HiddenFunctionConfig", "HiddenFunctionEnv", "hidden_f"]
