"""What several parts of playbook need and none owns: running a coroutine from sync code, the
distribution's name for install hints, who holds something shared, URLs as a user may see them,
the control flow of a row stepping aside, argparse types.  Nothing here is for users."""
