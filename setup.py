"""Packaging driven by settings.ini, in the manner of the nbdev 2 template."""
import shlex
from configparser import ConfigParser

import setuptools

config = ConfigParser(delimiters=["="])
config.read("settings.ini", encoding="utf-8")
cfg = config["DEFAULT"]

required = "version description keywords author author_email lib_name lib_path license min_python console_scripts".split()
missing = [key for key in required if key not in cfg]
if missing:
    raise SystemExit(f"settings.ini is missing {missing}")

licenses = {"apache2": ("Apache Software License 2.0", "OSI Approved :: Apache Software License")}
license_name, license_classifier = licenses[cfg["license"]]

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    keywords=cfg["keywords"],
    author=cfg["author"],
    author_email=cfg["author_email"],
    license=license_name,
    classifiers=[f"License :: {license_classifier}", "Programming Language :: Python :: 3"],
    url=cfg["git_url"],
    packages=setuptools.find_packages(include=[cfg["lib_path"], cfg["lib_path"] + ".*"]),
    include_package_data=True,
    install_requires=shlex.split(cfg.get("requirements", "")),
    extras_require={"dev": shlex.split(cfg.get("dev_requirements", "")),
                    "torch": shlex.split(cfg.get("torch_requirements", "")),
                    "fast": shlex.split(cfg.get("fast_requirements", "")),
                    "lab": shlex.split(cfg.get("lab_requirements", "")),
                    "pandas": shlex.split(cfg.get("pandas_requirements", "")),
                    "tensorboard": shlex.split(cfg.get("tensorboard_requirements", "")),
                    "nbgrader": shlex.split(cfg.get("nbgrader_requirements", ""))},
    python_requires=">=" + cfg["min_python"],
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    zip_safe=False,
    entry_points={
        "console_scripts": cfg["console_scripts"].split(),
        "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
    },
)
