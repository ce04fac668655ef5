from django.apps import AppConfig
from django.conf import settings

from chatsite import dotted


class ConversationsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "conversations"

    def ready(self) -> None:
        # A wrong dotted path stops every process at start, not the first turn that needs it.
        dotted.load_callable("CONVERSATION_TOOLS_PROVIDER", settings.CONVERSATION_TOOLS_PROVIDER)
