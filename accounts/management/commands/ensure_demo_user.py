"""`python manage.py ensure_demo_user`: a staff login for a local `make run`, printed once."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create (or reset) the local demo superuser and print the URL and its login."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="demo")
        parser.add_argument("--url", default="http://127.0.0.1:8000/")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        password_file = settings.DATA_DIR / "demo_password"
        if password_file.exists():
            password = password_file.read_text().strip()
        else:
            password = secrets.token_urlsafe(12)
            settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
        user, _ = User.objects.get_or_create(username=username)
        user.is_staff = True
        user.is_superuser = True
        user.set_password(password)
        user.save(update_fields=["is_staff", "is_superuser", "password"])
        self.stdout.write(f"Open {options['url']} and log in as {username} / {password}")
