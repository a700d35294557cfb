"""MkDocs hook: the site's API reference is the OpenAPI document the API itself serves.

It is generated at build time from the same code as ``GET /openapi.json`` (with
the shipped templates), and rendered by the same Swagger UI the API serves at
``/docs``, from the ``swagger-ui-bundle`` package: no copy to drift, no CDN.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    from api.docs_page import INIT_SCRIPT, swagger_index
    from api.openapi import openapi_document
    from gpupool.templates import load_templates

    document = openapi_document(load_templates(str(REPO / "slurm_templates")))
    files.append(File.generated(config, "api/openapi.json", content=json.dumps(document, indent=2, sort_keys=True)))
    files.append(File.generated(config, "api/index.html", content=swagger_index("openapi.json", "./")))
    files.append(File.generated(config, "api/gpupool-init.js", content=INIT_SCRIPT))
    return files


def on_post_build(config: MkDocsConfig, **_: Any) -> None:
    # Copied, not added as generated files: MkDocs drops a generated stylesheet.
    from api.docs_page import swagger_assets

    target = Path(config.site_dir) / "api"
    for name, path in swagger_assets().items():
        shutil.copyfile(path, target / name)
