"""ClassAd constraints (`jobstore q -constraint EXPR`) evaluated in the database.

classad2 parses and evaluates ClassAd expressions but exposes no syntax tree (`ExprTree` has
only `eval` and `simplify`), so the subset that has an exact SQL equivalent is parsed here by a
small hand-written parser: literals, attribute references, comparisons (== != < <= > >= =?= =!=
is isnt), && || !, + - * and parentheses. Whatever else (functions, ?:, lists, records, unknown
attributes, string ordering) is kept as it is: the top-level conjuncts that translate filter in
SQL, and then the whole expression is evaluated exactly by classad2 on each remaining job's ad.

ClassAd semantics are kept: every boolean sub-expression becomes three SQL predicates that are
never NULL, "is true", "is false" and "is undefined" (none of them means error), so that
UNDEFINED and ERROR propagate through ! && || exactly as in ClassAds. A constraint matches a job
only when it evaluates to true. String == and != ignore ASCII case like ClassAds; =?= does not.
This module is the one place for that SQL; the store's reads and actions run it as their `where`.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import classad2
from classad2 import ClassAd, ExprTree
from sqlalchemy import BigInteger, ColumnElement, String, and_, case, false, literal, not_, or_
from sqlalchemy import true as sql_true
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import GenericFunction

from jobstore.db.phases import status_in, status_not_in
from jobstore.db.schema import jobs
from jobstore.errors import ConstraintError, JobstoreError
from jobstore.formats.views import JOB_STATUS

__all__ = ["ConstraintError", "Plan", "plan", "matches", "ATTRIBUTES", "JOB_STATUS"]


@dataclass(frozen=True)
class Column:
    """A job-ad attribute that is a column: SQL expression, ClassAd type, may be undefined."""

    sql: Any
    type: str  # "int" or "str"
    nullable: bool = False


_STATUS_CASE = case(
    *((jobs.c.status == s, literal(n, BigInteger)) for s, n in JOB_STATUS.items()),
    else_=literal(0, BigInteger),
)

# Job-ad attribute (lower case, ClassAd names are case-insensitive) -> column. They must hold
# exactly what views.job_ad puts in the ad; tests/store/test_query.py checks that with classad2.
ATTRIBUTES: dict[str, Column] = {
    "clusterid": Column(jobs.c.cluster_id, "int"),
    "procid": Column(jobs.c.proc_id, "int"),
    "owner": Column(jobs.c.owner, "str"),
    "jobstatus": Column(_STATUS_CASE, "int"),
    "jobstorestatus": Column(jobs.c.status, "str"),
    "jobstorequeue": Column(jobs.c.queue, "str"),
    "jobstorejobid": Column(jobs.c.id, "int"),
    "jobprio": Column(jobs.c.priority, "int"),
    "requestcpus": Column(jobs.c.request_cpus, "int"),
    "requestmemory": Column(jobs.c.request_memory, "int"),
    "requestdisk": Column(jobs.c.request_disk, "int"),
    "numjobstarts": Column(jobs.c.num_starts, "int"),
    "jobstoreclaims": Column(jobs.c.claims, "int"),
    "exitcode": Column(jobs.c.exit_code, "int", nullable=True),
    "exitsignal": Column(jobs.c.exit_signal, "int", nullable=True),
    "jobpid": Column(jobs.c.job_pid, "int", nullable=True),
    "remotehost": Column(jobs.c.slot, "str", nullable=True),
}


class ascii_lower(GenericFunction):  # noqa: N801 - an SQL function name
    """lower() of ASCII letters only, as ClassAd string comparison (strcasecmp) folds case."""

    type = String()
    inherit_cache = True


@compiles(ascii_lower)
def _lower_default(element: Any, compiler: Any, **kw: Any) -> str:
    return f"lower({compiler.process(element.clauses, **kw)})"  # SQLite's folds ASCII only


@compiles(ascii_lower, "postgresql")
def _lower_on_postgresql(element: Any, compiler: Any, **kw: Any) -> str:
    upper = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return f"translate({compiler.process(element.clauses, **kw)}, '{upper}', '{upper.lower()}')"


# ---- a parser for the translatable subset ------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)
    | (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op>=\?=|=!=|==|!=|<=|>=|&&|\|\||>>>|<<|>>|[-+*/%<>!()\[\]{}.,;?:=|&^~])
    )""",
    re.VERBOSE,
)


class _Unparsed(JobstoreError):
    """Syntax this parser does not know; the expression is then evaluated by classad2 only."""


@dataclass(frozen=True)
class Node:
    kind: str  # "lit", "attr", "un", "bin", "opaque"
    value: Any = None  # literal ("int", v) / ("str", v) / ("bool", v) / ("undef",) ...; name; op
    args: tuple[Node, ...] = ()


_OPAQUE = Node("opaque")
_KEYWORDS = {
    "true": Node("lit", ("bool", True)),
    "false": Node("lit", ("bool", False)),
    "undefined": Node("lit", ("undef",)),
    "error": Node("lit", ("error",)),
}
# Binary operators by precedence, lowest first (ClassAd reference manual).
_LEVELS: list[set[str]] = [
    {"||"},
    {"&&"},
    {"|"},
    {"^"},
    {"&"},
    {"==", "!=", "=?=", "=!=", "is", "isnt"},
    {"<", "<=", ">", ">="},
    {"<<", ">>", ">>>"},
    {"+", "-"},
    {"*", "/", "%"},
]


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _Unparsed(text[pos:])
        out.append(m.group(m.lastgroup or "op"))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise _Unparsed(f"expected {expected}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.ternary()
        if self.peek() is not None:
            raise _Unparsed(self.peek())
        return node

    def ternary(self) -> Node:
        cond = self.binary(0)
        if self.peek() == "?":
            self.take()
            self.ternary()
            self.take(":")
            self.ternary()
            return _OPAQUE
        return cond

    def binary(self, level: int) -> Node:
        if level == len(_LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while (self.peek() or "").lower() in _LEVELS[level]:
            op = self.take().lower()
            op = {"is": "=?=", "isnt": "=!="}.get(op, op)
            left = Node("bin", op, (left, self.binary(level + 1)))
        return left

    def unary(self) -> Node:
        if self.peek() in ("!", "-", "+", "~"):
            op = self.take()
            return Node("un", op, (self.unary(),))
        return self.postfix()

    def postfix(self) -> Node:
        node = self.primary()
        while self.peek() in ("[", "."):
            if self.take() == "[":
                self.ternary()
                self.take("]")
            else:
                self.take()
            node = _OPAQUE
        return node

    def primary(self) -> Node:
        tok = self.take()
        if tok == "(":
            node = self.ternary()
            self.take(")")
            return node
        if tok == "{":
            self._items("}")
            return _OPAQUE
        if tok == "[":  # a record: too rare in constraints to be worth parsing
            raise _Unparsed(tok)
        if tok[0].isdigit() or tok[0] == ".":
            if re.fullmatch(r"\d+", tok):
                return Node("lit", ("int", int(tok)))
            return Node("lit", ("real", float(tok)))
        if tok[0] == '"':
            body = tok[1:-1]
            # escapes are classad2's business; such a literal is left to it
            return Node("lit", ("str", body)) if "\\" not in body else _OPAQUE
        if re.fullmatch(r"[A-Za-z_]\w*", tok):
            low = tok.lower()
            if self.peek() == "(":
                self.take()
                self._items(")")
                return _OPAQUE
            if low in ("my", "target") and self.peek() == ".":
                self.take()
                name = self.take()
                if not re.fullmatch(r"[A-Za-z_]\w*", name):
                    raise _Unparsed(name)
                # scoped references are left to classad2 (which has MY.x undefined here)
                return _OPAQUE
            if low in ("is", "isnt"):
                raise _Unparsed(tok)
            return _KEYWORDS.get(low, Node("attr", low))
        raise _Unparsed(tok)

    def _items(self, close: str) -> None:
        if self.peek() == close:
            self.take()
            return
        while True:
            self.ternary()
            if self.take() == close:
                return


# ---- translation to SQL ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Val:
    sql: Any
    type: str  # "int", "str", "undef"
    defined: ColumnElement[bool]


@dataclass(frozen=True)
class _Tri:
    true: ColumnElement[bool]
    false: ColumnElement[bool]
    undef: ColumnElement[bool]


_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}


def _value(node: Node) -> _Val | None:
    if node.kind == "lit":
        kind = node.value[0]
        if kind == "int":
            return _Val(literal(node.value[1], BigInteger), "int", sql_true())
        if kind == "str":
            return _Val(literal(node.value[1], String), "str", sql_true())
        if kind == "undef":
            return _Val(None, "undef", false())
        return None
    if node.kind == "attr":
        col = ATTRIBUTES.get(node.value)
        if col is None:
            return None
        return _Val(col.sql, col.type, col.sql.is_not(None) if col.nullable else sql_true())
    if node.kind == "un" and node.value in ("-", "+"):
        v = _value(node.args[0])
        if v is None or v.type not in ("int", "undef"):
            return None
        return v if node.value == "+" or v.type == "undef" else _Val(-v.sql, "int", v.defined)
    if node.kind == "bin" and node.value in _ARITH:
        a, b = _value(node.args[0]), _value(node.args[1])
        if a is None or b is None or {a.type, b.type} - {"int", "undef"}:
            return None
        if "undef" in (a.type, b.type):
            return _Val(None, "undef", false())
        return _Val(_ARITH[node.value](a.sql, b.sql), "int", and_(a.defined, b.defined))
    return None


def _status_set(op: str, attr: Node, lit: Node, flipped: bool) -> _Tri | None:
    """JobStatus compared with a number, as `status IN (...)` with its phases: the index can
    serve it."""
    if attr.kind != "attr" or attr.value != "jobstatus" or lit.kind != "lit":
        return None
    if lit.value[0] != "int":
        return None
    n = lit.value[1]
    if op in ("=?=", "=!="):
        hit = {s for s, code in JOB_STATUS.items() if code == n}
        yes, no = status_in(hit), status_not_in(hit)
        return _Tri(yes, no, false()) if op == "=?=" else _Tri(no, yes, false())
    fn = _CMP[op]
    hit = {s for s, code in JOB_STATUS.items() if (fn(n, code) if flipped else fn(code, n))}
    return _Tri(status_in(hit), status_not_in(hit), false())


def _compare(op: str, left: Node, right: Node) -> _Tri | None:
    fast = _status_set(op, left, right, False) or _status_set(op, right, left, True)
    if fast is not None:
        return fast
    a, b = _value(left), _value(right)
    if a is None or b is None:
        return None
    if op in ("=?=", "=!="):  # never undefined: same type and value, or both undefined
        both_undef = and_(not_(a.defined), not_(b.defined))
        same = and_(a.defined, b.defined, a.sql == b.sql) if a.type == b.type != "undef" else None
        hit = both_undef if same is None else or_(both_undef, same)
        return _Tri(hit, not_(hit), false()) if op == "=?=" else _Tri(not_(hit), hit, false())
    both = and_(a.defined, b.defined)
    if "undef" in (a.type, b.type) or a.type != b.type:  # undefined, or error when both defined
        return _Tri(false(), false(), not_(both))
    if a.type == "str":
        if op not in ("==", "!="):  # string ordering is left to classad2
            return None
        cmp = _CMP[op](ascii_lower(a.sql), ascii_lower(b.sql))
    else:
        cmp = _CMP[op](a.sql, b.sql)
    return _Tri(and_(both, cmp), and_(both, not_(cmp)), not_(both))


def _bool(node: Node) -> _Tri | None:
    if node.kind == "lit":
        kind = node.value[0]
        if kind == "bool":
            return (
                _Tri(sql_true(), false(), false())
                if node.value[1]
                else _Tri(false(), sql_true(), false())
            )
        if kind == "undef":
            return _Tri(false(), false(), sql_true())
        if kind == "error":
            return _Tri(false(), false(), false())
        return None
    if node.kind == "un" and node.value == "!":
        x = _bool(node.args[0])
        return None if x is None else _Tri(x.false, x.true, x.undef)
    if node.kind != "bin":
        return None
    if node.value in ("&&", "||"):
        a, b = _bool(node.args[0]), _bool(node.args[1])
        if a is None or b is None:
            return None
        if node.value == "&&":
            return _Tri(
                and_(a.true, b.true),
                or_(a.false, and_(or_(a.true, a.undef), b.false)),
                or_(and_(a.true, b.undef), and_(a.undef, or_(b.true, b.undef))),
            )
        return _Tri(
            or_(a.true, and_(or_(a.false, a.undef), b.true)),
            and_(a.false, b.false),
            or_(and_(a.false, b.undef), and_(a.undef, or_(b.false, b.undef))),
        )
    if node.value in _CMP or node.value in ("=?=", "=!="):
        return _compare(node.value, node.args[0], node.args[1])
    return None


def _conjuncts(node: Node) -> list[Node]:
    if node.kind == "bin" and node.value == "&&":
        return _conjuncts(node.args[0]) + _conjuncts(node.args[1])
    return [node]


@dataclass(frozen=True)
class Plan:
    """How to run a constraint: `where` filters in SQL (None: no filter); when `residual` is
    set, each job that passes `where` must also match it, evaluated by classad2."""

    text: str
    where: ColumnElement[bool] | None
    residual: ExprTree | None
    translated: int  # top-level conjuncts done in SQL
    conjuncts: int


def plan(text: str) -> Plan:
    """Parse a constraint (ConstraintError if it is not a ClassAd expression) and plan it."""
    if not text.strip():
        raise ConstraintError("empty constraint")
    try:
        expr = ExprTree(text)
    except (classad2.ClassAdException, ValueError, TypeError):
        raise ConstraintError(f"invalid constraint expression: {text}") from None
    try:
        parts = _conjuncts(_Parser(text).parse())
    except _Unparsed:
        return Plan(text, None, expr, 0, 1)
    done = [t.true for t in map(_bool, parts) if t is not None]
    where = and_(*done) if done else None
    residual = None if len(done) == len(parts) else expr
    return Plan(text, where, residual, len(done), len(parts))


def matches(expr: ExprTree, ad: ClassAd) -> bool:
    """Whether `expr` holds for `ad` as HTCondor's constraints do: true, or a non-zero number."""
    value = expr.eval(ad)
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and not isinstance(value, classad2.Value):
        return value != 0
    return False
