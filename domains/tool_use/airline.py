"""The tau-bench airline tools, written over the airline database with copy-on-write state.

The fourteen tools (search_direct_flight, book_reservation, ...) are reimplemented from what the
tau-bench trajectories show: the calls, their recorded outputs, the error messages, and the
agent policy. Each tool takes a `State` and keyword arguments and returns a JSON-like value or a
string; `call_tool` turns that into the tool message text (JSON for values, the string as is).

State is layered: the shared `AirlineDatabase` (read-only, loaded once), a pivot layer (the
writes of the expert's earlier calls, replayed once per pivot) and a sample layer (the writes of
one sampled action). A write copies only the one record it changes into the top layer, so a
sample never sees another sample's writes and no step copies the whole database.

Where a tau-bench behaviour makes one call's cost grow without bound, it is bounded here:
- `cancel_reservation` of a reservation already cancelled returns it unchanged. tau-bench
  appends the negation of every payment-history entry on each call, refunds included, so the
  history doubles per call (the refunds of refunds sum to zero: no money moves either way);
  18 parallel cancels made a 29 MB observation, 50 exhausted the machine's memory.
- `calculate` refuses an expression longer than 1,000 characters (the longest recorded is 197):
  parsing a 1 MB sum took 1.7 s and 200 MB.
Every verdict on the bundled pivots and every replayed output is unchanged by either.
"""

from __future__ import annotations

import ast
import datetime
import gzip
import json
import operator
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError

TABLES = ("flights", "users", "reservations")
DATA_PACKAGE = "pivot_envs.domains.tool_use"

# The booking clock of tau-bench airline ("The current time is 2024-05-15 15:00:00 EST").
NOW = "2024-05-15T15:00:00"
# tau-bench issues every new reservation this id (seen in every recorded booking).
NEW_RESERVATION_ID = "HATHAT"
# Certificate ids send_certificate hands out, first free one first (seen in the recordings).
CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")
# The airports list_all_airports returns; the database holds codes only, the names come from
# the recorded output of this tool.
AIRPORTS = {
    "SFO": "San Francisco",
    "JFK": "New York",
    "LAX": "Los Angeles",
    "ORD": "Chicago",
    "DFW": "Dallas",
    "DEN": "Denver",
    "SEA": "Seattle",
    "ATL": "Atlanta",
    "MIA": "Miami",
    "BOS": "Boston",
    "PHX": "Phoenix",
    "IAH": "Houston",
    "LAS": "Las Vegas",
    "MCO": "Orlando",
    "EWR": "Newark",
    "CLT": "Charlotte",
    "MSP": "Minneapolis",
    "DTW": "Detroit",
    "PHL": "Philadelphia",
    "LGA": "LaGuardia",
}


class AirlineDatabaseError(PivotEnvsError, FileNotFoundError):
    """A directory given as the airline database that lacks one of its tables."""


class ToolError(Exception):
    """A tool refused the call; the message becomes the tool output ("Error: ...")."""


def clone(value: Any) -> Any:
    """A deep copy of JSON-like data (dicts, lists, scalars), much faster than copy.deepcopy."""
    kind = type(value)
    if kind is dict:
        return {k: clone(v) for k, v in value.items()}
    if kind is list:
        return [clone(v) for v in value]
    return value


class AirlineDatabase:
    """The initial airline database: flights, users and reservations (shared, never written)."""

    def __init__(self, flights: dict, users: dict, reservations: dict) -> None:
        self.tables = {"flights": flights, "users": users, "reservations": reservations}
        # Flight numbers by origin, in database order: searches read only the flights that can match.
        self.flights_by_origin: dict[str, list[str]] = {}
        for number, flight in flights.items():
            self.flights_by_origin.setdefault(flight["origin"], []).append(number)

    @classmethod
    def from_directory(cls, directory: str | Path) -> AirlineDatabase:
        """Load flights/users/reservations `.json` or `.json.gz` files from a directory."""
        directory = Path(directory)
        tables = {}
        for table in TABLES:
            for name, opener in ((f"{table}.json.gz", gzip.open), (f"{table}.json", open)):
                path = directory / name
                if path.is_file():
                    with opener(path, "rt", encoding="utf-8") as handle:
                        tables[table] = json.load(handle)
                    break
            else:
                raise AirlineDatabaseError(f"airline database: no {table}.json(.gz) in {directory}")
        return cls(**tables)


@cache
def bundled_database() -> AirlineDatabase:
    """The airline database shipped with the package (loaded once per process)."""
    return AirlineDatabase.from_directory(Path(str(resources.files(DATA_PACKAGE) / "data" / "airline")))


@cache
def tool_schemas() -> list[dict[str, Any]]:
    """The OpenAI function schemas of the airline tools (written for this backend)."""
    path = resources.files(DATA_PACKAGE) / "data" / "airline_tools.json"
    return json.loads(path.read_text(encoding="utf-8"))


class State:
    """A copy-on-write view of the database: reads fall through to the parent, writes stay here."""

    __slots__ = ("database", "parent", "writes")

    def __init__(self, database: AirlineDatabase, parent: State | None = None) -> None:
        self.database = database
        self.parent = parent
        self.writes: dict[str, dict[str, Any]] = {"flights": {}, "users": {}, "reservations": {}}

    def child(self) -> State:
        """A new empty layer over this one (one per sampled action)."""
        return State(self.database, self)

    def get(self, table: str, key: Any) -> Any:
        """The current record (read-only: never mutate it; use get_mut to write)."""
        layer: State | None = self
        while layer is not None:
            writes = layer.writes[table]
            if key in writes:
                return writes[key]
            layer = layer.parent
        return self.database.tables[table].get(key) if isinstance(key, str) else None

    def get_mut(self, table: str, key: Any) -> Any:
        """The record, copied into this layer first so changes stay here (None if absent)."""
        writes = self.writes[table]
        if key in writes:
            return writes[key]
        record = self.get(table, key)
        if record is None:
            return None
        writes[key] = record = clone(record)
        return record

    def put(self, table: str, key: str, record: Any) -> None:
        self.writes[table][key] = record

    def changes(self) -> dict[str, dict[str, Any]]:
        """This layer's writes that differ from the layer below (the state change of its calls)."""
        out: dict[str, dict[str, Any]] = {}
        for table, writes in self.writes.items():
            for key, record in writes.items():
                below = self.parent.get(table, key) if self.parent else self.database.tables[table].get(key)
                if record != below:
                    out.setdefault(table, {})[key] = record
        return out


# -- the tools -------------------------------------------------------------------------------------


def _flight_for_date(state: State, number: str, date: str) -> dict[str, Any]:
    flight = state.get("flights", number)
    if flight is None:
        raise ToolError(f"flight {number} not found")
    data = flight["dates"].get(date) if isinstance(date, str) else None
    if data is None or data.get("status") != "available":
        raise ToolError(f"flight {number} not available on date {date}")
    return flight


def search_direct_flight(state: State, origin: str, destination: str, date: str) -> list[dict[str, Any]]:
    results = []
    for number in state.database.flights_by_origin.get(origin, ()):
        flight = state.get("flights", number)
        if flight["destination"] != destination:
            continue
        data = flight["dates"].get(date)
        if data is not None and data["status"] == "available":
            found = {k: v for k, v in flight.items() if k != "dates"}
            found.update(data)
            results.append(found)
    return results


def _next_day(date: str) -> str:
    return (datetime.date.fromisoformat(date) + datetime.timedelta(days=1)).isoformat()


def search_onestop_flight(
    state: State, origin: str, destination: str, date: str
) -> list[list[dict[str, Any]]]:
    results = []
    flights_by_origin = state.database.flights_by_origin
    for first_number in flights_by_origin.get(origin, ()):
        first = state.get("flights", first_number)
        first_data = first["dates"].get(date)
        if first_data is None or first_data["status"] != "available":
            continue
        arrival = first["scheduled_arrival_time_est"]
        second_date = _next_day(date) if "+1" in arrival else date
        for second_number in flights_by_origin.get(first["destination"], ()):
            second = state.get("flights", second_number)
            if second["destination"] != destination or arrival > second["scheduled_departure_time_est"]:
                continue
            second_data = second["dates"].get(second_date)
            if second_data is None or second_data["status"] != "available":
                continue
            leg1 = {k: v for k, v in first.items() if k != "dates"}
            leg1.update(first_data)
            leg1["date"] = date
            leg2 = {k: v for k, v in second.items() if k != "dates"}
            leg2.update(second_data)
            leg2["date"] = second_date
            results.append([leg1, leg2])
    return results


def list_all_airports(state: State) -> dict[str, str]:
    return AIRPORTS


def get_user_details(state: State, user_id: str) -> dict[str, Any]:
    user = state.get("users", user_id)
    if user is None:
        raise ToolError("user not found")
    return user


def get_reservation_details(state: State, reservation_id: str) -> dict[str, Any]:
    reservation = state.get("reservations", reservation_id)
    if reservation is None:
        raise ToolError("reservation not found")
    return reservation


def book_reservation(
    state: State,
    user_id: str,
    origin: str,
    destination: str,
    flight_type: str,
    cabin: str,
    flights: list[dict[str, Any]],
    passengers: list[dict[str, Any]],
    payment_methods: list[dict[str, Any]],
    total_baggages: int,
    nonfree_baggages: int,
    insurance: str,
) -> dict[str, Any]:
    if state.get("users", user_id) is None:
        raise ToolError("user not found")
    user = state.get("users", user_id)
    booked = clone(flights)
    total = 0
    for leg in booked:
        number = leg["flight_number"]
        flight = _flight_for_date(state, number, leg["date"])
        data = flight["dates"][leg["date"]]
        if data["available_seats"][cabin] < len(passengers):
            raise ToolError(f"not enough seats on flight {number}")
        leg["price"] = data["prices"][cabin]
        leg["origin"] = flight["origin"]
        leg["destination"] = flight["destination"]
        total += leg["price"] * len(passengers)
    if insurance == "yes":
        total += 30 * len(passengers)
    total += 50 * nonfree_baggages
    for payment in payment_methods:
        method = user["payment_methods"].get(payment["payment_id"])
        if method is None:
            raise ToolError(f"payment method {payment['payment_id']} not found")
        if method["source"] in ("gift_card", "certificate") and method["amount"] < payment["amount"]:
            raise ToolError(f"not enough balance in payment method {payment['payment_id']}")
    paid = sum(payment["amount"] for payment in payment_methods)
    if paid != total:
        raise ToolError(f"payment amount does not add up, total price is {total}, but paid {paid}")
    user = state.get_mut("users", user_id)
    for payment in payment_methods:
        method = user["payment_methods"][payment["payment_id"]]
        if method["source"] == "gift_card":
            method["amount"] -= payment["amount"]
        elif method["source"] == "certificate":
            del user["payment_methods"][payment["payment_id"]]
    reservation = {
        "reservation_id": NEW_RESERVATION_ID,
        "user_id": user_id,
        "origin": origin,
        "destination": destination,
        "flight_type": flight_type,
        "cabin": cabin,
        "flights": booked,
        "passengers": clone(passengers),
        "payment_history": clone(payment_methods),
        "created_at": NOW,
        "total_baggages": total_baggages,
        "nonfree_baggages": nonfree_baggages,
        "insurance": insurance,
    }
    state.put("reservations", NEW_RESERVATION_ID, reservation)
    user["reservations"].append(NEW_RESERVATION_ID)
    return reservation


def cancel_reservation(state: State, reservation_id: str) -> dict[str, Any]:
    current = state.get("reservations", reservation_id)
    if current is None:
        raise ToolError("reservation not found")
    if current.get("status") == "cancelled":
        # tau-bench would refund the refunds again, doubling the history per call (module docstring).
        return current
    reservation = state.get_mut("reservations", reservation_id)
    refunds = [
        {"payment_id": p["payment_id"], "amount": -p["amount"]} for p in reservation["payment_history"]
    ]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    return reservation


def _charge(state: State, user_id: str, payment_id: str, amount: float) -> None:
    """Check a payment method for an update of a reservation and charge (or refund) a gift card."""
    method = (state.get("users", user_id) or {}).get("payment_methods", {}).get(payment_id)
    if method is None:
        raise ToolError("payment method not found")
    if method["source"] == "certificate":
        raise ToolError("certificate cannot be used to update reservation")
    if method["source"] == "gift_card":
        if method["amount"] < amount:
            raise ToolError("gift card balance is not enough")
        state.get_mut("users", user_id)["payment_methods"][payment_id]["amount"] -= amount


def update_reservation_baggages(
    state: State, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
) -> dict[str, Any]:
    current = state.get("reservations", reservation_id)
    if current is None:
        raise ToolError("reservation not found")
    price = 50 * max(0, nonfree_baggages - current["nonfree_baggages"])
    _charge(state, current["user_id"], payment_id, price)
    reservation = state.get_mut("reservations", reservation_id)
    reservation["total_baggages"] = total_baggages
    reservation["nonfree_baggages"] = nonfree_baggages
    if price != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": price})
    return reservation


def update_reservation_flights(
    state: State, reservation_id: str, cabin: str, flights: list[dict[str, Any]], payment_id: str
) -> dict[str, Any]:
    current = state.get("reservations", reservation_id)
    if current is None:
        raise ToolError("reservation not found")
    travellers = len(current["passengers"])
    new_flights = clone(flights)
    # The first current segment of each (flight, date): a lookup, so the cost is linear in the legs.
    current_legs: dict[tuple[Any, Any], dict[str, Any]] = {}
    for segment in current["flights"]:
        current_legs.setdefault((segment["flight_number"], segment["date"]), segment)
    total = 0
    for leg in new_flights:
        number, date = leg["flight_number"], leg["date"]
        # A segment kept in the same cabin keeps the price it was bought at (policy: "their
        # prices will not be updated based on the current price").
        kept = current_legs.get((number, date))
        if kept is not None and cabin == current["cabin"]:
            leg["price"], leg["origin"], leg["destination"] = (
                kept["price"],
                kept["origin"],
                kept["destination"],
            )
        else:
            flight = _flight_for_date(state, number, date)
            data = flight["dates"][date]
            if data["available_seats"][cabin] < travellers:
                raise ToolError(f"not enough seats on flight {number}")
            leg["price"] = data["prices"][cabin]
            leg["origin"] = flight["origin"]
            leg["destination"] = flight["destination"]
        total += leg["price"] * travellers
    total -= sum(f["price"] for f in current["flights"]) * travellers
    _charge(state, current["user_id"], payment_id, total)
    reservation = state.get_mut("reservations", reservation_id)
    reservation["flights"] = new_flights
    # The recorded tau-bench tool leaves the reservation's cabin as it was; we reproduce that.
    if total != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": total})
    return reservation


def update_reservation_passengers(
    state: State, reservation_id: str, passengers: list[dict[str, Any]]
) -> dict[str, Any]:
    current = state.get("reservations", reservation_id)
    if current is None:
        raise ToolError("reservation not found")
    if len(passengers) != len(current["passengers"]):
        raise ToolError("number of passengers does not match")
    reservation = state.get_mut("reservations", reservation_id)
    reservation["passengers"] = clone(passengers)
    return reservation


def send_certificate(state: State, user_id: str, amount: float) -> str:
    if state.get("users", user_id) is None:
        raise ToolError("user not found")
    methods = state.get("users", user_id)["payment_methods"]
    for certificate in CERTIFICATE_IDS:
        if certificate not in methods:
            user = state.get_mut("users", user_id)
            user["payment_methods"][certificate] = {
                "source": "certificate",
                "amount": amount,
                "id": certificate,
            }
            return f"Certificate {certificate} added to user {user_id} with amount {amount}."
    raise ToolError("too many certificates")


_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_CALCULATOR_CHARACTERS = frozenset("0123456789+-*/(). ")
# Longer expressions are refused before parsing (module docstring); the longest recorded is 197.
MAX_EXPRESSION_CHARS = 1000


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ToolError("invalid expression")


def calculate(state: State, expression: str) -> str:
    if not isinstance(expression, str) or not set(expression) <= _CALCULATOR_CHARACTERS:
        raise ToolError("invalid characters in expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression too long: {len(expression)} characters, at most {MAX_EXPRESSION_CHARS}")
    try:
        return str(round(float(_evaluate(ast.parse(expression, mode="eval"))), 2))
    except (SyntaxError, ArithmeticError, RecursionError, ValueError, MemoryError) as error:
        raise ToolError(f"invalid expression: {error}") from None


def think(state: State, thought: str) -> str:
    return ""


def transfer_to_human_agents(state: State, summary: str) -> str:
    return "Transfer successful"


TOOLS: dict[str, Callable[..., Any]] = {
    tool.__name__: tool
    for tool in (
        book_reservation,
        calculate,
        cancel_reservation,
        get_reservation_details,
        get_user_details,
        list_all_airports,
        search_direct_flight,
        search_onestop_flight,
        send_certificate,
        think,
        transfer_to_human_agents,
        update_reservation_baggages,
        update_reservation_flights,
        update_reservation_passengers,
    )
}


def call_tool(state: State, name: str, arguments: Any) -> str:
    """Run one tool call on `state` (writing into its top layer); returns the tool message text.

    Any refusal or malformed argument becomes an "Error: ..." output, as in tau-bench; nothing
    raises. A failed call leaves no writes behind.
    """
    tool = TOOLS.get(name)
    if tool is None:
        return f"Error: unknown tool {name}"
    if not isinstance(arguments, dict):
        return f"Error: arguments of {name} must be a JSON object"
    saved = {table: dict(writes) for table, writes in state.writes.items()}
    try:
        result = tool(state, **arguments)
    except ToolError as error:
        state.writes = saved
        return f"Error: {error}"
    except (
        TypeError,
        KeyError,
        ValueError,
        AttributeError,
        IndexError,
        ArithmeticError,
        RecursionError,
    ) as error:
        # Malformed arguments (wrong type, missing field): the tool's answer, not a crash.
        state.writes = saved
        return f"Error: {name} failed on its arguments: {type(error).__name__}: {error}"
    return result if isinstance(result, str) else json.dumps(result)
