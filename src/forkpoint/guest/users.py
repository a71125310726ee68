"""Guest accounts: who a process runs as, and who owns the files written for it."""

from __future__ import annotations

import grp
import os
import pwd
import stat as stat_mod
from dataclasses import dataclass

from ..protocol import ErrorCode
from .context import GuestError

__all__ = ["Account", "account", "chown_to", "group_name", "may_write", "owner_name"]


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, as initgroups would set them
    home: str
    shell: str


def account(name: str) -> Account:
    """The guest account ``name``. Raises GuestError not_found if there is none."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise GuestError(ErrorCode.NOT_FOUND, f"no such user in the guest: {name}") from None
    return Account(
        name=pw.pw_name,
        uid=pw.pw_uid,
        gid=pw.pw_gid,
        groups=tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)),
        home=pw.pw_dir,
        shell=pw.pw_shell or "/bin/sh",
    )


def chown_to(path: str, acct: Account | None, *, follow_symlinks: bool = True) -> None:
    """Give ``path`` to ``acct`` (nothing to do for None: the agent's root owns it)."""
    if acct is not None:
        os.chown(path, acct.uid, acct.gid, follow_symlinks=follow_symlinks)


def may_write(acct: Account, directory: str) -> bool:
    """Whether ``acct`` may create and remove entries in ``directory`` (mode bits only)."""
    if acct.uid == 0:
        return True
    st = os.stat(directory)
    if st.st_uid == acct.uid:
        return bool(st.st_mode & stat_mod.S_IWUSR)
    if st.st_gid == acct.gid or st.st_gid in acct.groups:
        return bool(st.st_mode & stat_mod.S_IWGRP)
    return bool(st.st_mode & stat_mod.S_IWOTH)


def owner_name(uid: int) -> str:
    """The user name of ``uid``, or the number when the guest has no such user."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
