import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell
def _():
    import marimo as mo

    mo.md(
        """
        # playbook in marimo

        The same plays, receipts and live panel as in Jupyter. `%%play` is a Jupyter magic: here a
        play is a function (`@pb.play`), and `leads.play.map(enrich)` runs it. Open this notebook
        with `marimo edit notebooks/07_marimo.py`.
        """
    )
    return (mo,)


@app.cell
def _():
    import pandas as pd

    import playbook as pb

    demo = pb.demo.serve()  # the demo provider: real HTTP on 127.0.0.1

    def email_tool(name, provider):
        return pb.http_tool(
            name,
            provider=provider,
            method="GET",
            url=demo.url + "/v1/email",
            params={"domain": "{domain}", "first": "{first}", "last": "{last}"},
            headers={"Authorization": "Bearer {secret}"},
            secret=pb.secret("DEMO_API_KEY", default="demo-key"),
            pick="email",
            miss_status=(404,),
            cost=1.0,
        )

    def leads(first, n=2_000):
        """``n`` made-up leads, numbered from ``first``."""
        numbers = range(first, first + n)
        return pd.DataFrame(
            {
                "domain": [f"firm{i}.example" for i in numbers],
                "first": "Ada",
                "last": [f"Lovelace{i}" for i in numbers],
            }
        )

    find_email = email_tool("acme.email", pb.Provider("acme", rps=400, concurrency=16))

    @pb.play
    async def enrich(row, ctx):
        return {"email": await ctx.tool(find_email, domain=row.domain, first=row.first, last=row.last)}

    return demo, email_tool, enrich, leads, pb


@app.cell
def _(enrich, leads):
    # The live panel shows in this cell's output while the run goes; its summary stays when it ends.
    # Keep the result in a variable: a cell's last expression would take the summary's place.
    enriched = leads(0).play.map(enrich)
    return (enriched,)


@app.cell
def _(demo, enriched, mo, pb):
    stats = pb.last_run().stats
    mo.md(
        f"{len(enriched):,} rows: {stats.ok:,} ok, {stats.failed:,} failed; {stats.calls_executed:,} calls paid; "
        f"the demo provider at {demo.url} was sent {demo.stats()['requests']:,} requests"
    )
    return


@app.cell
def _(mo):
    mo.md(
        """
        A background run returns at once and goes on while you work in other cells. Its panel has
        Stop, Retry parked and Retry failed buttons. This one goes at 20 requests a second, so 2,000
        rows would take 100 seconds: press Stop. A blocking `map()` is stopped by marimo's own stop
        button instead (the calls in flight land their receipts; a rerun picks up the rest).
        """
    )
    return


@app.cell
def _(email_tool, enriched, leads, mo, pb):
    # A background run goes on in the notebook's event loop; run as a script, there is none.
    mo.stop(not mo.running_in_notebook(), mo.md("(a background run needs the notebook: `marimo edit`)"))
    slow_email = email_tool("slow.email", pb.Provider("slow", rps=20, concurrency=2))

    @pb.play
    async def enrich_slowly(row, ctx):
        return {"email": await ctx.tool(slow_email, domain=row.domain, first=row.first, last=row.last)}

    more = leads(len(enriched) + 100_000)  # other leads than the map's, started once it is done
    background = more.play.run(enrich_slowly, background=True)
    return (background,)


if __name__ == "__main__":
    app.run()
