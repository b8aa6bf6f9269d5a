"""What every experiment shares: flags → runs → :func:`orthojax.train.trainer.train` → report.

An experiment module (``experiments/uci.py``, …) carries only its science, as an
:class:`Experiment` that :func:`main` runs (:mod:`.driver`):

1. its flagfile names a config file and overrides
   (``--config=experiments/configs/<exp>.py[:variant]``, ``--config.a.b=value``: an
   ``ml_collections`` ConfigDict whose keys are those of
   :class:`~orthojax.train.config.Config`) and sets the experiment's own flags
   (:mod:`.cli`);
2. it turns the base :class:`~orthojax.train.config.Config` into a list of
   :class:`Run` s (one per variant × seed × split …), each tagged with the
   setting it belongs to; each distinct program is built abstractly before any run
   trains (:mod:`.checks`);
3. :func:`execute` trains each run in ``<workdir>/runs/<tags>/`` (a finished
   run is read back instead of retrained, and only for the config that produced it
   (:mod:`.fingerprints`); an unfinished one resumes from its checkpoint — rerunning the
   same command continues an interrupted experiment; :mod:`.runs`);
4. it turns the records into :class:`Row` s — a setting, a metric, our
   values over seeds/splits, the paper's number — and :func:`write_report`
   writes ``results.json`` and ``report.md`` and prints the table (:mod:`.report`,
   :mod:`.plots`).

``python -m experiments.report <workdirs…>`` merges several reports.

An experiment in stages (E5, E8) also has: ``--stages`` (:mod:`.stages`); a probe stage
whose per-cell learning rates the train stage reads from ``rates.json`` or
``--rates_from`` (:mod:`.rates`, :mod:`.probe`); records measured once and cached per
run, and ``--include_workdirs`` to merge other workdirs' runs (:mod:`.records`).
"""

from experiments._harness.checks import check_fixed
from experiments._harness.checks import compile_runs
from experiments._harness.checks import prepare
from experiments._harness.cli import compile_only
from experiments._harness.cli import config_from_flags
from experiments._harness.cli import define_flags
from experiments._harness.cli import define_list
from experiments._harness.cli import fail
from experiments._harness.cli import fail_on_config_error
from experiments._harness.cli import flag_list
from experiments._harness.cli import is_writer
from experiments._harness.cli import num_seeds
from experiments._harness.cli import parse_flags
from experiments._harness.cli import print_config_help
from experiments._harness.cli import run
from experiments._harness.driver import Experiment
from experiments._harness.driver import main
from experiments._harness.driver import start
from experiments._harness.plots import bar_figure
from experiments._harness.plots import data_label
from experiments._harness.plots import local_render
from experiments._harness.plots import log_axis
from experiments._harness.plots import plot_curves
from experiments._harness.plots import plot_rows
from experiments._harness.plots import pyplot
from experiments._harness.plots import save_figure
from experiments._harness.plots import suptitle
from experiments._harness.probe import Probe
from experiments._harness.probe import best_rate
from experiments._harness.probe import probe_groups
from experiments._harness.rates import RATES_FILE
from experiments._harness.rates import cell_name
from experiments._harness.rates import cell_rates
from experiments._harness.rates import check_rates_flags
from experiments._harness.rates import define_rates_flags
from experiments._harness.rates import given_rates
from experiments._harness.rates import probe_cells
from experiments._harness.rates import probe_trial
from experiments._harness.rates import rates_notes
from experiments._harness.rates import rates_path
from experiments._harness.rates import read_rates
from experiments._harness.rates import with_rates
from experiments._harness.records import cached_record
from experiments._harness.records import define_include_flag
from experiments._harness.records import included_records
from experiments._harness.records import record_path
from experiments._harness.report import Row
from experiments._harness.report import markdown_table
from experiments._harness.report import number_format
from experiments._harness.report import plural
from experiments._harness.report import read_results
from experiments._harness.report import relative_to
from experiments._harness.report import write_report
from experiments._harness.runs import Run
from experiments._harness.runs import count_sitting
from experiments._harness.runs import execute
from experiments._harness.runs import result_path
from experiments._harness.runs import split_record_key
from experiments._harness.runs import throughput
from experiments._harness.runs import write_json
from experiments._harness.stages import chosen_stages
from experiments._harness.stages import define_stages_flag
