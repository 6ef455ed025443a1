"""The submit language: a submit description or a plain ClassAd file -> `JobSpec`s.

Submit descriptions are read with ``htcondor2.Submit`` (the condor_submit language: macros,
``+Attr``, queue statements); plain ClassAd files in either the old (``Name = value`` lines, ads
separated by blank lines) or the new (``[ ... ]``) syntax. Every bad input raises
:class:`SubmitError` with a one-line message that names the file and, where possible, the command
or attribute.

Conventions of the produced :class:`JobSpec`:

* ``args`` / ``env`` are HTCondor "new" (V2 raw) syntax strings: what the job ad's
  ``Arguments`` / ``Environment`` string attributes hold, without the outer double quotes that
  the submit language uses.
* Expression texts (``requirements``, ``retry_until``, ``custom`` values) are in the *new*
  ClassAd syntax, i.e. ``classad2.ExprTree(text)`` parses them with the intended meaning.
  Submit files and old-syntax ClassAd files use the old syntax, in which a backslash inside a
  string is literal; such backslashes are doubled on the way in.  Outside strings with
  backslashes the text is kept as written.
* ``retry_until`` given as a plain integer ``N`` becomes ``ExitCode == N``.
"""

from jobstore.errors import SubmitError
from jobstore.submit.classadfile import parse_classad_file
from jobstore.submit.description import parse_submit_file, parse_submit_text
from jobstore.submit.limits import MAX_PROCS
from jobstore.submit.reader import load_jobs
from jobstore.submit.syntax import join_args_v2, split_args_v2
from jobstore.submit.values import old_expr_to_new

__all__ = [
    "MAX_PROCS",
    "SubmitError",
    "join_args_v2",
    "load_jobs",
    "old_expr_to_new",
    "parse_classad_file",
    "parse_submit_file",
    "parse_submit_text",
    "split_args_v2",
]
