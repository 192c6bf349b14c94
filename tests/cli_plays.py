"""The head of the plays files the command-line tests write: a paid email lookup on the demo
provider (whose URL the test puts in ``$DEMO_URL``), one dollar a call."""

EMAIL_TOOL = """
import asyncio, os
import playbook as pb

acme = pb.Provider("acme", concurrency=8)
find_email = pb.http_tool(
    "acme.email", provider=acme, method="GET", url=os.environ["DEMO_URL"] + "/v1/email",
    params={"domain": "{domain}", "first": "{first}"},
    headers={"Authorization": "Bearer {secret}"}, secret=pb.secret("DEMO_API_KEY", default="demo-key"),
    pick="email", miss_status=(404,), cost=1.0,
)
"""
