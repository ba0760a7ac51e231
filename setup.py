"""Packaging for torchstage."""
import re
from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent
version = re.search(r'__version__ = "([^"]+)"', (here / "torchstage" / "version.py").read_text()).group(1)

setup(
    name="torchstage",
    version=version,
    description="A callback-driven runner for PyTorch: one process, many GPUs, SLURM clusters.",
    long_description=(here / "README.md").read_text() if (here / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["torchstage", "torchstage.*"]),
    python_requires=">=3.9",
    install_requires=["torch>=2.1,<3", "numpy", "tqdm", "tensorboardX>=2.6", "pyyaml"],
    extras_require={
        # transformers: the Hugging Face example and tests (tiny models built from configs, no download)
        "test": ["pytest>=7", "pytest-timeout", "pytest-xdist", "pytest-randomly", "scikit-learn", "matplotlib",
                 "tensorboard", "transformers>=4.50", "py-spy"],  # py-spy: the stacks of a script past its timeout
        "plot": ["matplotlib"],
        "mpi": ["mpi4py>=3.1"],  # rank 0's host and port for MPI launches without a scheduler host list
        "mlflow": ["mlflow>=2.10", "matplotlib"],
        "docs": ["sphinx>=7", "myst-parser"],
        "torchmetrics": ["torchmetrics>=1.0"],
        "torchdata": ["torchdata>=0.8"],
        "optuna": ["optuna>=3.4"],
        "onnx": ["onnx>=1.14"],  # utils.onnx_export (Catalyst 22's): torch.onnx.export writes the file with it
        "deepspeed": ["deepspeed>=0.19,<0.20"],  # strategy="deepspeed" (ZeRO 1-3)
        # train(init_from=<a safetensors file or Hugging Face folder>), torchstage checkpoint export --format safetensors
        "hf": ["safetensors>=0.4"],
        # The tests' reference: tests/catalyst/ runs each Catalyst 22 script on real Catalyst 22.04 too, live, and
        # compares the weights bit for bit (numbers recorded on another CPU cannot match). accelerate<0.30: Catalyst
        # 22.04's engines use accelerate APIs that later releases deprecate and drop (DistributedType.TPU, ...).
        "catalyst-reference": ["catalyst==22.4", "accelerate<0.30"],
    },
    entry_points={"console_scripts": ["torchstage=torchstage.cli:main"]},
    license="Apache-2.0",
)
