"""Each route of the API declared once: its Flask rule, who may call it, and its OpenAPI operation.

``@operation(bp, "GET", "/jobs/<job_id>", roles=ALL_ROLES, summary=..., responses=...)``
registers the view on its blueprint, records the member roles that may call it (api.auth
checks them on every request) and records the operation that api.openapi publishes. A
route without roles or without its document cannot be declared: ``operation`` raises,
and ``require_every_route_declared`` refuses an app with a route made any other way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from flask import Blueprint, Flask
from pydantic import BaseModel

from gpupool.models.members import MEMBER_ROLES

View = TypeVar("View", bound=Callable[..., Any])
SCHEMA_REF = "#/components/schemas/{model}"
# Every operation with a token: 400 for a query parameter given twice (api.query), 401 for a
# missing or refused token, 403 when the caller's role in the account, or its key's scope, does
# not allow it (gpupool.members' roles, api_keys' scopes), 429 past a rate limit, 503 when the
# rate-limit store or the database does not answer.
AUTH_ERRORS: Final = (400, 401, 403, 429, 503)
# Routes about one account (api.billing.visible_account): an admin token may name another.
ACCOUNT_PARAM: Final[Mapping[str, Any]] = {
    "name": "account", "in": "query", "schema": {"type": "string"}, "description": "Admin tokens only: another account",
}


class RouteDeclarationError(Exception):
    """A route declared without what every route needs; raised at import, never at a request."""


@dataclass(frozen=True)
class Public:
    """The access of a route that takes no token (health, the document, metrics)."""


PUBLIC: Final = Public()
Access = frozenset[str] | Public


@dataclass(frozen=True)
class Reply:
    """One documented answer: its description, and its JSON model or other content."""

    description: str
    model: type[BaseModel] | None = None
    content: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, Any] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"description": self.description}
        if self.headers:
            out["headers"] = dict(self.headers)
        content = {**self.content, **(json_content(self.model) if self.model is not None else {})}
        if content:
            out["content"] = content
        return out


@dataclass(frozen=True)
class Operation:
    """What api.openapi publishes for one method of one path."""

    path: str
    method: str
    access: Access
    summary: str
    description: str | None
    parameters: tuple[Mapping[str, Any], ...]
    request_body: Mapping[str, Any] | None
    replies: Mapping[str, Reply]
    errors: tuple[int, ...]
    models: tuple[type[BaseModel], ...]

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"summary": self.summary}
        if self.description is not None:
            out["description"] = self.description
        if isinstance(self.access, Public):
            out["security"] = []
        if self.parameters:
            out["parameters"] = [dict(parameter) for parameter in self.parameters]
        if self.request_body is not None:
            out["requestBody"] = dict(self.request_body)
        errors = self.errors if isinstance(self.access, Public) else (*self.errors, *AUTH_ERRORS)
        out["responses"] = {**{status: reply.document() for status, reply in self.replies.items()}, **error_replies(*errors)}
        return out


# Filled as the blueprints' modules are imported: (OpenAPI path, lower-case method) -> operation,
# and Flask endpoint -> who may call it.
OPERATIONS: dict[tuple[str, str], Operation] = {}
ACCESS: dict[str, Access] = {}


def json_content(model: type[BaseModel] | str) -> dict[str, Any]:
    name = model if isinstance(model, str) else model.__name__
    return {"application/json": {"schema": {"$ref": SCHEMA_REF.format(model=name)}}}


def error_replies(*codes: int) -> dict[str, Any]:
    return {str(code): {"description": "Error", "content": json_content("ErrorOut")} for code in codes}


def openapi_path(rule: str) -> str:
    """``/files/<storage_path:path>`` as OpenAPI writes it: ``/files/{path}``."""
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule)


def _record_access(endpoint: str, access: Access) -> None:
    if not isinstance(access, Public):
        if not access or not access <= set(MEMBER_ROLES):
            raise RouteDeclarationError(f"{endpoint}: roles must be member roles, at least one: {sorted(access)}")
    if ACCESS.setdefault(endpoint, access) != access:
        raise RouteDeclarationError(f"{endpoint} is declared twice with different roles")


def operation(
    blueprint: Blueprint,
    method: str,
    rule: str,
    *,
    roles: Access,
    summary: str,
    replies: Mapping[str, Reply],
    description: str | None = None,
    parameters: Sequence[Mapping[str, Any]] = (),
    request: type[BaseModel] | None = None,
    request_body: Mapping[str, Any] | None = None,
    errors: Collection[int] = (),
    **rule_options: Any,
) -> Callable[[View], View]:
    """Register ``rule`` on ``blueprint`` for ``method``, with its roles and its OpenAPI operation.

    ``request``: a JSON body the view validates with that model (required); ``request_body``: any
    other body, as OpenAPI writes it. ``errors``: the error statuses the view answers; those of
    authentication (AUTH_ERRORS) are added for every route that takes a token.
    """
    if not summary or not replies:
        raise RouteDeclarationError(f"{method} {rule}: a route needs a summary and its answers")
    if request is not None and request_body is not None:
        raise RouteDeclarationError(f"{method} {rule}: request or request_body, not both")
    path, lower = openapi_path(rule), method.lower()
    models = tuple(reply.model for reply in replies.values() if reply.model is not None)
    documented = Operation(
        path=path, method=lower, access=roles, summary=summary, description=description,
        parameters=tuple(parameters),
        request_body={"required": True, "content": json_content(request)} if request is not None else request_body,
        replies=replies, errors=tuple(errors), models=(*((request,) if request is not None else ()), *models),
    )

    def register(view: View) -> View:
        if (path, lower) in OPERATIONS:
            raise RouteDeclarationError(f"{method} {path} is declared twice")
        _record_access(f"{blueprint.name}.{view.__name__}", roles)
        OPERATIONS[(path, lower)] = documented
        blueprint.route(rule, methods=[method], **rule_options)(view)
        return view

    return register


def public_asset(blueprint: Blueprint, rule: str) -> Callable[[View], View]:
    """A GET route that takes no token and is not part of the API's document (a page's script, its styles)."""

    def register(view: View) -> View:
        _record_access(f"{blueprint.name}.{view.__name__}", PUBLIC)
        blueprint.route(rule, methods=["GET"])(view)
        return view

    return register


def access_of(endpoint: str) -> Access:
    """Who may call ``endpoint``; LookupError for one never declared (require_every_route_declared prevents it)."""
    try:
        return ACCESS[endpoint]
    except KeyError:
        raise LookupError(f"endpoint {endpoint!r} was not declared with api.routing.operation") from None


def roles_of(endpoint: str) -> frozenset[str]:
    """The roles that may call a route that takes a token (the pages check theirs by the API route they stand for)."""
    access = access_of(endpoint)
    if isinstance(access, Public):
        raise LookupError(f"endpoint {endpoint!r} takes no token: no role applies")
    return access


def require_every_route_declared(app: Flask, *, exempt_blueprints: Collection[str], exempt_endpoints: Collection[str]) -> None:
    """Refuse an app with an API route registered other than through ``operation`` or ``public_asset``."""
    undeclared = sorted(
        rule.rule for rule in app.url_map.iter_rules()
        if rule.endpoint not in ACCESS and rule.endpoint not in exempt_endpoints
        and rule.endpoint.split(".")[0] not in exempt_blueprints
    )
    if undeclared:
        raise RouteDeclarationError(f"routes declared without api.routing.operation: {', '.join(undeclared)}")
