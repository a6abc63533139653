"""The ``edgevit`` command line: one module per command group, assembled here.

Every command reports user errors, click's own usage errors included, as one
``error:`` line on stderr and exits with status 1; results print as a table,
or as JSON with ``--json``. TensorFlow is imported by the commands that need
it, not by the group, so ``edgevit --help`` starts without it.
"""
from __future__ import annotations

import os
import sys

import click

from edgevit.cli import models, profile, train, weights
from edgevit import keras_backend_problem
from edgevit.cli.output import (INTERRUPTED_EXIT, ExitAtOnce, GuardedStdout, escape_unencodable_output,
                                reopen_closed_standard_streams, report_error)
from edgevit.errors import EdgevitError


class EdgevitGroup(click.Group):
    """A click group whose usage errors (unknown option, missing argument,
    value out of range) exit like every other user error: one ``error:`` line
    and status 1, not click's usage block and status 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        reopen_closed_standard_streams()
        escape_unencodable_output()
        stdout = sys.stdout
        sys.stdout = GuardedStdout(stdout)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as err:
            click.echo(err.ctx.get_help())
            code = 0
        except click.UsageError as err:
            message = err.format_message()
            if not message.endswith((".", "?", ")")):
                message += "."
            report_error(message + (f" See `{err.ctx.command_path} --help`." if err.ctx else ""))
        except click.ClickException as err:
            report_error(err.format_message())
        except EdgevitError as err:  # outside a command: writing --help or --version failed
            report_error(str(err))
        except click.Abort:
            click.echo("interrupted", err=True)
            sys.exit(INTERRUPTED_EXIT)
        except ExitAtOnce as exit:
            if args is not None:  # called with its arguments (a test's runner), not as this process's command line
                raise
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exit.code)
        finally:
            sys.stdout = stdout
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=EdgevitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgevit")
def main():
    """Vision transformers from Keras 3 to fully-int8 LiteRT models on phones.

    \b
    Exit status:
      0    done
      1    a user error (a bad argument, input file or output path): one line
           starting `error:` on stderr, and no output written
      2-5  findings of `edgevit check` asked to fail on them, e.g. an op
           that falls back to the CPU, or Arm64 kernels that compute
           another answer (see `edgevit check --help`)
      130  interrupted (Ctrl-C), partial output removed
      143  terminated (SIGTERM), partial output removed

    edgevit runs on Keras's TensorFlow backend: a KERAS_BACKEND naming
    another one is refused.
    """
    problem = keras_backend_problem()  # before any command imports Keras, which fixes its backend on import
    if problem:
        raise EdgevitError(problem)


for _command in (models.list_command, models.info_command, models.convert_command, models.bundle_command,
                 profile.bench_command, profile.check_command, weights.import_weights_command,
                 train.finetune_command, train.qat_command, train.eval_command):
    main.add_command(_command)
