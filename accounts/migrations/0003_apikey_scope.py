from django.db import migrations, models


class Migration(migrations.Migration):
    """API key scopes. Keys that exist were all-powerful: they become `full`, so that no
    integration breaks; a key made from now on is `chat` unless its owner asks for more."""

    dependencies = [
        ("accounts", "0002_apikey_store_conversations"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="scope",
            field=models.CharField(default="full", max_length=8),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="apikey",
            name="scope",
            field=models.CharField(
                choices=[("chat", "Chat only"), ("full", "Full account")],
                default="chat",
                help_text=(
                    "Chat only: the OpenAI-compatible API, conversations, messages and "
                    "generations. Full account: also API keys and billing."
                ),
                max_length=8,
            ),
        ),
    ]
