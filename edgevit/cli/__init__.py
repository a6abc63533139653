"""The ``edgevit`` command line: one module per command group, assembled here.

Every command reports user errors as one ``error:`` line on stderr and exits
with status 1; results print as a table, or as JSON with ``--json``.
TensorFlow is imported by the commands that need it, not by the group, so
``edgevit --help`` starts without it.
"""
from __future__ import annotations

import click

from edgevit.cli import models, profile, train, weights


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgevit")
def main():
    """Vision transformers from Keras 3 to fully-int8 LiteRT models on phones."""


for _command in (models.list_command, models.info_command, models.convert_command, models.bundle_command,
                 profile.bench_command, profile.check_command, weights.import_weights_command,
                 train.finetune_command, train.qat_command, train.eval_command):
    main.add_command(_command)
