"""Data: the loading contract (loading: Dataset, the data root, seeded stratified subsets, a cache of raw
arrays per root), the image sets (vision), the text sets and tokenizers (text), and the file checks a
suite runs at load (checks). A loader registers itself in bench.registry.DATASETS."""
from bench.data.loading import DataError, Dataset, load_dataset, resolve_data_root

__all__ = ["DataError", "Dataset", "load_dataset", "resolve_data_root"]
