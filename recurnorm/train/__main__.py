"""``python -m recurnorm.train ARGS``: the ``recurnorm train`` command, one process per rank.

This is what torchrun starts (``torchrun --nproc_per_node=N -m recurnorm.train
--preset golf --data shards:DIR --out runs/golf``). It takes the options of
``recurnorm train``; a failing rank prints ``error: rank r of N: ...``, records
the error for ``recurnorm train --nproc`` and exits with the error's code.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    import click

    from ..cli.exitcodes import for_error
    from ..cli.train_cmd import train as command
    from ..errors import RecurnormError
    from .distributed import report_failure, shutdown

    code = 0
    try:
        command.main(args=argv, prog_name="python -m recurnorm.train", standalone_mode=False)
    except RecurnormError as exc:
        code = for_error(exc)
        report_failure(exc, code)
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
        report_failure(exc, code)
    except click.exceptions.Exit as exc:  # --help
        code = exc.exit_code
    except Exception as exc:  # a bug or a crash: keep the traceback, and still name the rank
        import traceback

        traceback.print_exc()
        code = 1
        report_failure(exc, code)
    finally:
        if code == 0:
            shutdown()
    return code


if __name__ == "__main__":
    from .distributed import exit_process

    exit_process(main())
