"""The reference story's review works end to end through the CLI entry point."""

import json

from criticalsvc.cli import main


def test_review_denies_provider_while_crs_carry_finalizer(capsys):
    """`review` of the provider's DELETE against the reference story prints a 403 denial."""
    code = main(["review", "--state", "api/examples/reference-story.yaml", "api/examples/reviews/delete-provider.json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["response"]["allowed"] is False
    assert out["response"]["status"]["code"] == 403
