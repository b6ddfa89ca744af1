"""Two units registering into one new registered model at once (cluster mode, one worker each): the second to
create it gets MLflow's RESOURCE_ALREADY_EXISTS, which is what it wanted. Real MLflow (a SQLite file); the
interleaving is forced: the other unit creates the model between this one's lookup and its create."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from enginefoundry.records.tracking import ensure_registered_model


class OtherUnitCreatesItFirst:
    """A real client whose lookup misses, after which another unit's real client creates the model."""

    def __init__(self, client: MlflowClient, other: MlflowClient) -> None:
        self.client, self.other = client, other

    def get_registered_model(self, name: str) -> Any:
        try:
            return self.client.get_registered_model(name)
        finally:
            self.other.create_registered_model(name)

    def create_registered_model(self, name: str, **kwargs: Any) -> Any:
        return self.client.create_registered_model(name, **kwargs)


def test_a_model_created_between_lookup_and_create_is_taken_as_it_is(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mine, other = MlflowClient(uri, registry_uri=uri), MlflowClient(uri, registry_uri=uri)
    mine.create_registered_model("raced")
    with pytest.raises(MlflowException, match="already exists"):  # what the second creator gets
        other.create_registered_model("raced")
    ensure_registered_model(OtherUnitCreatesItFirst(mine, other), "tiny-chat")
    assert mine.get_registered_model("tiny-chat").name == "tiny-chat"
    ensure_registered_model(mine, "tiny-chat")  # present: nothing to do
    ensure_registered_model(mine, "new-one")  # absent: created
    assert mine.get_registered_model("new-one").name == "new-one"

