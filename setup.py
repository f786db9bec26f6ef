"""Package layout: app, engine_ext, models_catalog with their subpackages, and assets/ as `llmtui_assets`."""

from setuptools import find_packages, setup

CODE = ["app", "engine_ext", "models_catalog"]

setup(
    packages=find_packages(include=[p for name in CODE for p in (name, f"{name}.*")]) + ["llmtui_assets"],
    package_dir={"llmtui_assets": "assets"},
    package_data={"llmtui_assets": ["**/*"], "models_catalog": ["catalog.toml"]},
)
